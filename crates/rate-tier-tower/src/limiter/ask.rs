//! What a decision is asked ([`Ask`]), and [`LimitRequest`], the public way
//! to ask it.

use std::borrow::Cow;

use smallvec::SmallVec;

use rate_tier_storage::Rule;

use crate::identity::OwnQuota;
use crate::limit::{Limit, Scope};

/// What one decision is asked: the identity, the tier's cost, the limits of
/// their own. Every way in (the layer, [`RateTier::check`],
/// [`RateTier::decide`]) makes one; it borrows everything, and is copied
/// freely.
///
/// [`RateTier::check`]: crate::RateTier::check
/// [`RateTier::decide`]: crate::RateTier::decide
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ask<'a> {
    /// The user and the tier they claim; `None`: no identity.
    pub(crate) identity: Option<(&'a str, &'a str)>,
    /// The tier's cost; 0 reads the buckets (a peek).
    pub(crate) cost: u32,
    /// Other limits that apply, each with its partition and cost.
    pub(crate) extra: &'a [Extra<'a>],
    /// Every limit in shadow mode.
    pub(crate) shadow: bool,
    /// The customer's own quotas, by tier or limit name.
    pub(crate) quotas: &'a [OwnQuota],
}

impl<'a> Ask<'a> {
    /// The tier's limit alone: `user` on `tier` at `cost`.
    #[inline]
    pub(crate) fn plan(user: &'a str, tier: &'a str, cost: u32) -> Self {
        Ask {
            identity: Some((user, tier)),
            cost,
            extra: &[],
            shadow: false,
            quotas: &[],
        }
    }

    /// The same, with the customer's own quotas.
    #[inline]
    pub(crate) fn with_quotas(mut self, quotas: &'a [OwnQuota]) -> Self {
        self.quotas = quotas;
        self
    }

    /// Whether it asks for the tier's enforced limit alone, and charges it:
    /// the common case, decided on a path of its own.
    #[inline]
    pub(crate) fn tier_alone(&self) -> Option<(&'a str, &'a str, u32)> {
        match (self.identity, self.extra.is_empty(), self.shadow) {
            (Some((user, tier)), true, false)
                if self.cost > 0 && self.quotas.is_empty() =>
            {
                Some((user, tier, self.cost))
            }
            _ => None,
        }
    }

    /// The claimed tier ("" without an identity).
    pub(crate) fn tier(&self) -> &'a str {
        self.identity.map_or("", |(_, tier)| tier)
    }
}

/// A limit of its own in a decision.
#[derive(Debug, Clone)]
pub(crate) struct Extra<'a> {
    pub(crate) limit: &'a Limit,
    /// `None`: the request's user (per-user limits).
    pub(crate) partition: Option<Cow<'a, str>>,
    pub(crate) cost: u32,
}

/// A request for [`RateTier::decide`](crate::RateTier::decide): a user on a
/// tier, the tier's cost, and other limits with their costs.
///
/// ```
/// use tower_rate_tier::{Limit, LimitRequest, Quota};
/// let search = Limit::new("search", Quota::per_minute(3));
/// let per_ip = Limit::new("ip", Quota::per_minute(1000));
/// let request = LimitRequest::new("key_ana", "free", 1)
///     .limit(&search, 1)
///     .limit_keyed(&per_ip, "203.0.113.7", 1);
/// # let _ = request;
/// ```
#[derive(Debug, Clone)]
pub struct LimitRequest<'a> {
    identity: Option<(&'a str, &'a str)>,
    cost: u32,
    extra: SmallVec<[Extra<'a>; 2]>,
    shadow: bool,
    quotas: Cow<'a, [OwnQuota]>,
}

impl<'a> LimitRequest<'a> {
    /// `user` on `tier`, costing the tier `cost` (0: a peek, every bucket
    /// read and none charged).
    #[inline(always)]
    pub fn new(user: &'a str, tier: &'a str, cost: u32) -> Self {
        LimitRequest::of(Some((user, tier)), cost)
    }

    /// A request of `identity` (`None`: none was found) at `cost`.
    #[inline(always)]
    pub(crate) fn of(identity: Option<(&'a str, &'a str)>, cost: u32) -> Self {
        LimitRequest {
            identity,
            cost,
            extra: SmallVec::new(),
            shadow: false,
            quotas: Cow::Borrowed(&[]),
        }
    }

    /// The customer's own quota for the tier or limit `name`, in place of
    /// the configured one (see [`TierIdentity::with_quota`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use tower_rate_tier::{LimitRequest, Quota, RateTier};
    /// let limiter = RateTier::builder().tier("pro", Quota::per_minute(100)).build();
    /// let request = LimitRequest::new("key_ada", "pro", 1).quota("pro", Quota::per_minute(500));
    /// let info = limiter.decide(&request).await.unwrap().unwrap();
    /// assert_eq!((info.limit, info.remaining), (500, 499));
    /// # }
    /// ```
    ///
    /// [`TierIdentity::with_quota`]: crate::TierIdentity::with_quota
    pub fn quota(
        mut self,
        name: impl Into<Cow<'static, str>>,
        rule: impl Into<Rule>,
    ) -> Self {
        let name = name.into();
        let quotas = self.quotas.to_mut();
        quotas.retain(|(n, _)| *n != name);
        quotas.push((name, rule.into()));
        self
    }

    /// The same, with these own quotas (an identity's).
    pub(crate) fn with_quotas(mut self, quotas: &'a [OwnQuota]) -> Self {
        self.quotas = Cow::Borrowed(quotas);
        self
    }

    /// Adds `limit`, charged `cost`, in the user's bucket (a
    /// [global](Limit::global) limit: in its one bucket).
    #[inline(always)]
    pub fn limit(self, limit: &'a Limit, cost: u32) -> Self {
        let partition = match limit.scope {
            Scope::Global => Some(Cow::Borrowed("")),
            _ => None,
        };
        self.with(Extra {
            limit,
            partition,
            cost,
        })
    }

    /// Adds `limit`, charged `cost`, in the bucket of `key` (an address, a
    /// tenant).
    pub fn limit_keyed(
        self,
        limit: &'a Limit,
        key: &'a str,
        cost: u32,
    ) -> Self {
        self.with(Extra {
            limit,
            partition: Some(Cow::Borrowed(key)),
            cost,
        })
    }

    /// Every limit in shadow mode: decided and reported, nothing refused.
    pub fn shadow(mut self) -> Self {
        self.shadow = true;
        self
    }

    /// Adds a limit of its own, as the layer found it.
    #[inline(always)]
    pub(crate) fn with(mut self, extra: Extra<'a>) -> Self {
        self.extra.push(extra);
        self
    }

    /// The same, shadow or not.
    pub(crate) fn shadowed(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// What the decision is asked.
    #[inline]
    pub(crate) fn ask(&self) -> Ask<'_> {
        Ask {
            identity: self.identity,
            cost: self.cost,
            extra: &self.extra,
            shadow: self.shadow,
            quotas: &self.quotas,
        }
    }
}
