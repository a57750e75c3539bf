//! Limits beside the tier's: per endpoint, per address, per tenant, global.
//!
//! A request's limits are its tier's quota plus any [`Limit`]s that apply
//! to it, and they are decided as **one** decision: every bucket is
//! charged, or none is. A refusal names the limit that refused.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use gcra_core::Quota;
use http::StatusCode;
use http::request::Parts;
use rate_tier_storage::{LimitName, Rule, RuleKind};

use crate::error::ConfigError;
use crate::tiers::{Namespace, StaticName, intern};

type KeyFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;
type WhenFn = dyn Fn(&Parts) -> bool + Send + Sync;
type CostFn = dyn Fn(&Parts) -> u32 + Send + Sync;
type ActualFn = dyn Fn(&http::response::Parts) -> Option<u32> + Send + Sync;
type RefundFn = dyn Fn(StatusCode) -> bool + Send + Sync;

/// A limit of its own beside the tier's, with its own buckets.
///
/// By default it is per user (the request's identity), costs 1, applies to
/// every request, and is enforced. Each part can be changed:
///
/// | method | what |
/// |---|---|
/// | [`Limit::tier`] | a rule for one tier (the first one is for the others) |
/// | [`Limit::global`], [`Limit::keyed_by`], [`Limit::per_client_ip`] | one bucket for everyone, one per key of the request (a tenant), or one per client address |
/// | [`Limit::when`] | only some requests (a route) |
/// | [`Limit::cost`], [`Limit::cost_fn`], [`Limit::tier_cost`] | what a request costs it |
/// | [`Limit::shadow`] | decided and reported, never refusing |
/// | [`Limit::settle`] | the cost charged up front is an estimate, settled from the response |
///
/// An API's usual three layers (per address at the edge, per API key by tier,
/// per endpoint for expensive operations) as one decision:
///
/// ```
/// use tower_rate_tier::{client_ip::ClientIp, Limit, Quota, RateTier, TierIdentity, TierLimitLayer};
///
/// let tiers = RateTier::builder()
///     .tier("free", Quota::per_minute(60))
///     .tier("pro", Quota::per_minute(600))
///     .build();
/// let layer = TierLimitLayer::new(tiers)
///     .identifier_fn(|headers| {
///         let key = headers.get("x-api-key")?.to_str().ok()?;
///         Some(TierIdentity::new(key, if key == "key_bea" { "pro" } else { "free" }))
///     })
///     .limit(Limit::new("ip", Quota::per_minute(1000)).per_client_ip(ClientIp::RIGHTMOST_X_FORWARDED_FOR))
///     .limit(Limit::new("search", Quota::per_minute(10)).when(|req| req.uri.path() == "/search"))
///     .limit(Limit::new("export", Quota::per_minute(5)).when(|req| req.uri.path() == "/export"));
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct Limit {
    pub(crate) name: &'static str,
    pub(crate) key: &'static LimitName,
    rule: Rule,
    per_tier: Vec<(Box<str>, Rule)>,
    pub(crate) scope: Scope,
    pub(crate) when: Option<Arc<WhenFn>>,
    pub(crate) cost: LimitCost,
    pub(crate) shadow: bool,
    pub(crate) settle: Option<Settle>,
    /// The longest a request it is part of may wait for its slot (at most
    /// the limiter's): see [`Limit::wait_up_to`].
    pub(crate) wait_up_to: Option<Duration>,
}

/// Whose bucket a request charges.
#[derive(Clone)]
pub(crate) enum Scope {
    /// The request's user: one bucket per identity (and one slot with its
    /// tier's bucket on a Redis Cluster).
    User,
    /// One bucket for every request.
    Global,
    /// One bucket per key the function finds; `None`: the limit does not
    /// apply to that request.
    Keyed(Arc<KeyFn>),
    /// One bucket per client address (see [`crate::client_ip`]).
    ClientIp(crate::client_ip::ClientIp),
}

/// What a request costs a limit.
#[derive(Clone)]
pub(crate) enum LimitCost {
    Fixed(u32),
    /// The tier's cost for the request.
    Tier,
    Fn(Arc<CostFn>),
}

impl Scope {
    /// How a message names it: "per user", "global", "per key".
    pub(crate) fn described(&self) -> &'static str {
        match self {
            Scope::User => "per user",
            Scope::Global => "global",
            Scope::Keyed(_) => "per key",
            Scope::ClientIp(_) => "per client address",
        }
    }

    /// Whether two limits of these scopes are in one partition in every
    /// request they share: both per user, or both global. Two keyed limits
    /// may find different keys (and a key may be anything), so never.
    pub(crate) fn same_partition(&self, other: &Scope) -> bool {
        matches!(
            (self, other),
            (Scope::User, Scope::User) | (Scope::Global, Scope::Global)
        )
    }
}

impl fmt::Debug for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limit")
            .field("name", &self.name)
            .field("rule", &self.rule)
            .field("per_tier", &self.per_tier)
            .field("scope", &self.scope.described())
            .field("when", &self.when.is_some())
            .field("shadow", &self.shadow)
            .field("settle", &self.settle.is_some())
            .field("wait_up_to", &self.wait_up_to)
            .finish_non_exhaustive()
    }
}

impl Limit {
    /// A limit named `name` (1 to 64 `[A-Za-z0-9_.-]`), per user, of
    /// `rule` in every tier: a rate ([`Quota`]), an exact sliding window
    /// ([`Window`](crate::Window)) or a calendar period
    /// ([`Period`](crate::Period)). Its buckets are its own, even beside a
    /// tier of the same name (keys `trt:limit/<name>:...`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_rate_tier::{Limit, Period, PeriodUnit, Window};
    /// // At most 5 logins in any 60 s, exactly.
    /// let login = Limit::new("login", Window::new(5, Duration::from_secs(60))?);
    /// // 3 exports per calendar month (UTC) on free, 100 on pro.
    /// let exports = Limit::new("exports", Period::new(3, PeriodUnit::Month, 0)?)
    ///     .tier("pro", Period::new(100, PeriodUnit::Month, 0)?);
    /// # let _ = (login, exports);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Panics
    ///
    /// On an invalid name, at start-up. Use [`Limit::try_new`] for a
    /// `Result`.
    #[track_caller]
    pub fn new(name: impl Into<String>, rule: impl Into<Rule>) -> Limit {
        match Limit::try_new(name, rule) {
            Ok(limit) => limit,
            Err(error) => panic!("invalid Limit: {error}"),
        }
    }

    /// Like [`Limit::new`], with a typed error.
    ///
    /// ```
    /// use tower_rate_tier::{ConfigError, Limit, Quota};
    /// assert!(matches!(
    ///     Limit::try_new("a:b", Quota::per_minute(3)),
    ///     Err(ConfigError::InvalidTierName(_))
    /// ));
    /// ```
    pub fn try_new(
        name: impl Into<String>,
        rule: impl Into<Rule>,
    ) -> Result<Limit, ConfigError> {
        let key = intern(&name.into(), Namespace::Limit)?;
        Ok(Limit {
            name: key.as_str_static(),
            key,
            rule: rule.into(),
            per_tier: Vec::new(),
            scope: Scope::User,
            when: None,
            cost: LimitCost::Fixed(1),
            shadow: false,
            settle: None,
            wait_up_to: None,
        })
    }

    /// `rule` for requests of `tier` (the rule given to [`Limit::new`]
    /// stays for the other tiers). It may be of another kind than theirs.
    ///
    /// ```
    /// use tower_rate_tier::{Limit, Quota};
    /// let tokens = Limit::new("tokens", Quota::per_minute(1000))
    ///     .tier("pro", Quota::per_minute(10_000));
    /// assert_eq!(tokens.quota_for("pro"), Quota::per_minute(10_000));
    /// assert_eq!(tokens.quota_for("free"), Quota::per_minute(1000));
    /// ```
    pub fn tier(mut self, tier: &str, rule: impl Into<Rule>) -> Limit {
        self.per_tier.retain(|(t, _)| **t != *tier);
        self.per_tier.push((tier.into(), rule.into()));
        self
    }

    /// One bucket for every request (an endpoint's capacity, whoever asks).
    pub fn global(mut self) -> Limit {
        self.scope = Scope::Global;
        self
    }

    /// One bucket per key `key` finds in the request: a client address, a
    /// tenant, a route and a user. A request for which it finds none is not
    /// limited by this limit. Keys are hashed before any store sees them.
    pub fn keyed_by<F>(mut self, key: F) -> Limit
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.scope = Scope::Keyed(Arc::new(key));
        self
    }

    /// One bucket per client address, read from `source`: what a limit per
    /// address at the edge needs. Never the raw `X-Forwarded-For`, which
    /// the client writes: see [`client_ip`](crate::client_ip). A request
    /// whose header cannot be read shares one bucket, `unknown`, with the
    /// others like it (it is not let off); one without the connection's
    /// address, from a source that reads it, is answered 500 with
    /// [`LimitEvent::NoClientAddress`](crate::LimitEvent::NoClientAddress)
    /// (a server not set up to give it: never one bucket for everyone).
    ///
    /// ```
    /// use tower_rate_tier::{client_ip::ClientIp, Limit, Quota};
    /// let per_address = Limit::new("ip", Quota::per_minute(1000))
    ///     .per_client_ip(ClientIp::RIGHTMOST_X_FORWARDED_FOR);
    /// # let _ = per_address;
    /// ```
    pub fn per_client_ip(
        mut self,
        source: crate::client_ip::ClientIp,
    ) -> Limit {
        self.scope = Scope::ClientIp(source);
        self
    }

    /// Only requests for which `applies` holds (a route, a method). A peek
    /// ([`TierLimitLayer::peek_when`](crate::TierLimitLayer::peek_when))
    /// reads the limit whatever this says.
    pub fn when<F>(mut self, applies: F) -> Limit
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        self.when = Some(Arc::new(applies));
        self
    }

    /// What each request costs this limit (default 1).
    ///
    /// # Panics
    ///
    /// On a cost of 0 (use [`Limit::when`] for requests it should not
    /// charge).
    #[track_caller]
    pub fn cost(mut self, cost: u32) -> Limit {
        assert!(
            cost > 0,
            "a Limit's cost must be at least 1: use .when() to skip requests"
        );
        self.cost = LimitCost::Fixed(cost);
        self
    }

    /// What each request costs this limit, from the request. A cost of 0 is
    /// a bug in the function: the request is answered 500.
    pub fn cost_fn<F>(mut self, cost: F) -> Limit
    where
        F: Fn(&Parts) -> u32 + Send + Sync + 'static,
    {
        self.cost = LimitCost::Fn(Arc::new(cost));
        self
    }

    /// The same cost as the tier's for the request.
    pub fn tier_cost(mut self) -> Limit {
        self.cost = LimitCost::Tier;
        self
    }

    /// Shadow mode: decided, counted and reported
    /// ([`LimitEvent::ShadowLimited`](crate::LimitEvent::ShadowLimited),
    /// outcome `shadow_limited`), but never refusing. It is charged as it
    /// would be if enforced, so what it reports is what enforcing it would do.
    pub fn shadow(mut self) -> Limit {
        self.shadow = true;
        self
    }

    /// The cost charged up front is an estimate: after the response, the
    /// actual cost is read from it and the difference is charged (a debt
    /// the next requests wait for) or refunded. See [`Settle`].
    pub fn settle(mut self, settle: Settle) -> Limit {
        self.settle = Some(settle);
        self
    }

    /// A request this limit is part of waits at most `max_wait` for its
    /// slot, on a limiter that waits
    /// ([`RateTierBuilder::wait_up_to`](crate::RateTierBuilder::wait_up_to)):
    /// a request waits at most the shortest wait of its limits and the
    /// limiter's, so a limit can only shorten it. `Duration::ZERO`: a
    /// request of this limit never waits, it is refused at once as without
    /// waiting (a login limit, say, beside a tier whose short bursts wait).
    /// A shadow limit never shortens a wait (it never refuses).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// use tower_rate_tier::{Limit, LimitRequest, Quota, RateTier};
    /// tokio::time::pause();
    /// let limiter = RateTier::builder()
    ///     .tier("free", Quota::per_second(10).allow_burst(1))
    ///     .wait_up_to(Duration::from_millis(500))
    ///     .build();
    /// let login = Limit::new("login", Quota::per_minute(100)).wait_up_to(Duration::ZERO);
    /// limiter.check("ana", "free", 1).await.unwrap().unwrap();
    /// // A plain request waits its 100 ms; a login is refused at once.
    /// let login_request = LimitRequest::new("ana", "free", 1).limit(&login, 1);
    /// let refused = limiter.decide(&login_request).await.unwrap().unwrap_err();
    /// assert_eq!(refused.retry_after_secs(), 1); // 100 ms, rounded up
    /// limiter.check("ana", "free", 1).await.unwrap().unwrap();
    /// # }
    /// ```
    pub fn wait_up_to(mut self, max_wait: Duration) -> Limit {
        self.wait_up_to = Some(max_wait);
        self
    }

    /// The limit's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The quota that applies to a request of `tier`, when it is a rate
    /// (for a window or a period, a nominal rate of its limit per its
    /// length: see [`Limit::rule_for`]). A settled limit carries its debts
    /// whole (or up to [`Settle::max_debt`]).
    ///
    /// ```
    /// use tower_rate_tier::{Limit, Quota, Settle};
    /// let tokens = Limit::new("tokens", Quota::per_minute(1000))
    ///     .settle(Settle::from_header("x-tokens-used"));
    /// assert_eq!(tokens.quota_for("free"), Quota::per_minute(1000).unbounded_debt());
    /// ```
    pub fn quota_for(&self, tier: &str) -> Quota {
        self.rule_for(tier).as_quota()
    }

    /// The rule that applies to a request of `tier`; a rate's settled
    /// debts as [`Limit::quota_for`] says.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_rate_tier::{Limit, Quota, rules::Rule, Window};
    /// let window = Window::new(5, Duration::from_secs(60))?;
    /// let login = Limit::new("login", window).tier("pro", Quota::per_minute(60));
    /// assert_eq!(login.rule_for("free"), Rule::Window(window));
    /// assert_eq!(login.rule_for("pro"), Rule::Rate(Quota::per_minute(60)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn rule_for(&self, tier: &str) -> Rule {
        if self.per_tier.is_empty() && self.settle.is_none() {
            return self.rule;
        }
        let rule = self
            .per_tier
            .iter()
            .find(|(t, _)| **t == *tier)
            .map_or(self.rule, |(_, rule)| *rule);
        self.with_settle_debt(rule)
    }

    /// `rule` as this limit applies it: a settled rate carries the debt
    /// its settlements may leave.
    pub(crate) fn with_settle_debt(&self, rule: Rule) -> Rule {
        match (&self.settle, rule) {
            (Some(settle), Rule::Rate(quota)) => {
                Rule::Rate(settle.debt_of(quota))
            }
            _ => rule,
        }
    }

    /// The kinds of this limit's rules, the first tier's first.
    pub(crate) fn kinds(&self) -> impl Iterator<Item = RuleKind> + '_ {
        std::iter::once(self.rule.kind())
            .chain(self.per_tier.iter().map(|(_, rule)| rule.kind()))
    }
}

/// How a limit's estimated cost is settled after the response: where the
/// actual cost is read, and when everything is refunded.
///
/// The settlement is made when the response **body ends** (or is dropped,
/// the client gone): a streamed answer (server-sent events, where a model
/// reports its usage at the end) is settled with what it really cost, from
/// a trailer ([`Settle::from_trailer`]) or a meter the handler fills as it
/// streams ([`Settle::from_usage`]). The end of the body waits for a
/// settlement on a remote store (one more call); one left by a dropped body
/// is made in the background.
///
/// ```
/// use tower_rate_tier::{Limit, Quota, Settle};
/// let tokens = Limit::new("tokens", Quota::per_minute(1000))
///     .settle(Settle::from_header("x-tokens-used").refund_on_server_error());
/// # let _ = tokens;
/// ```
#[derive(Clone)]
pub struct Settle {
    pub(crate) actual: Actual,
    pub(crate) refund_on: Option<Arc<RefundFn>>,
    /// `None`: every debt carried whole.
    max_debt: Option<Duration>,
}

/// Where a settlement reads the actual cost.
#[derive(Clone)]
pub(crate) enum Actual {
    /// From the response head.
    Head(Arc<ActualFn>),
    /// From a trailer of the body.
    Trailer(http::HeaderName),
    /// From the request's [`Usage`] meter, at the end of the body.
    Usage,
}

impl fmt::Debug for Settle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let actual = match &self.actual {
            Actual::Head(_) => "response head",
            Actual::Trailer(_) => "trailer",
            Actual::Usage => "usage meter",
        };
        f.debug_struct("Settle")
            .field("actual", &actual)
            .field("refund_on", &self.refund_on.is_some())
            .field("max_debt", &self.max_debt)
            .finish_non_exhaustive()
    }
}

/// The integer in `value`, if it is one.
fn cost_in(value: &http::HeaderValue) -> Option<u32> {
    value.to_str().ok()?.trim().parse().ok()
}

impl Settle {
    /// The actual cost is the integer in the response header `name` (the
    /// handler writes it). A response without it keeps the estimate.
    pub fn from_header(name: &'static str) -> Settle {
        Settle::from_fn(move |response| cost_in(response.headers.get(name)?))
    }

    /// The actual cost is the integer in the trailer `name` of the response
    /// body (HTTP/2, gRPC: a stream that reports its cost at its end). A
    /// body without it, or dropped before its end, keeps the estimate.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name.
    ///
    /// ```
    /// use tower_rate_tier::{Limit, Quota, Settle};
    /// let tokens = Limit::new("tokens", Quota::per_minute(1000))
    ///     .settle(Settle::from_trailer("x-tokens-used"));
    /// # let _ = tokens;
    /// ```
    #[track_caller]
    pub fn from_trailer(name: &'static str) -> Settle {
        Settle {
            actual: Actual::Trailer(http::HeaderName::from_static(name)),
            refund_on: None,
            max_debt: None,
        }
    }

    /// The actual cost is what the handler records in the request's
    /// [`Usage`] meter (an extension of the request) while it answers,
    /// read when the body ends or is dropped (a client that goes away pays
    /// for what was generated). A meter left empty keeps the estimate.
    ///
    /// ```
    /// use axum::{Extension, Router, routing::get};
    /// use tower_rate_tier::{Limit, Quota, RateTier, Settle, TierIdentity, TierLimitLayer, Usage};
    ///
    /// async fn generate(Extension(usage): Extension<Usage>) -> String {
    ///     // ... stream the answer, and count as it goes:
    ///     usage.add(120);
    ///     "generated\n".into()
    /// }
    ///
    /// let tiers = RateTier::builder().tier("free", Quota::per_minute(10)).build();
    /// let layer = TierLimitLayer::new(tiers)
    ///     .identifier_fn(|_| Some(TierIdentity::new("ana", "free")))
    ///     .limit(Limit::new("tokens", Quota::per_minute(1000)).settle(Settle::from_usage()));
    /// let app: Router = Router::new().route("/generate", get(generate)).layer(layer);
    /// ```
    pub fn from_usage() -> Settle {
        Settle {
            actual: Actual::Usage,
            refund_on: None,
            max_debt: None,
        }
    }

    /// The actual cost is an extension of the response (the handler
    /// inserts an [`ActualCost`]).
    pub fn from_extension() -> Settle {
        Settle::from_fn(|response| {
            response.extensions.get::<ActualCost>().map(|cost| cost.0)
        })
    }

    /// The actual cost as `actual` reads it from the response head; `None`
    /// keeps the estimate.
    pub fn from_fn<F>(actual: F) -> Settle
    where
        F: Fn(&http::response::Parts) -> Option<u32> + Send + Sync + 'static,
    {
        Settle {
            actual: Actual::Head(Arc::new(actual)),
            refund_on: None,
            max_debt: None,
        }
    }

    /// Bounds the debt a settlement may leave (by default none: 1 000 000
    /// tokens settled on 1000 per minute wait 1000 minutes).
    ///
    /// The bound is what tells a debt from a clock that jumped back (a
    /// Redis failover to a replica whose clock is behind): a stored bucket
    /// further ahead than a burst window plus this is capped there. Without
    /// a bound, a clock that jumps back by an hour makes this limit's users
    /// wait up to an hour more; with one, debts beyond it are forgiven. See
    /// [`Quota::allow_debt`]. Bounds beyond 2^50 µs (35.7 years) are that.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_rate_tier::{Limit, Quota, Settle};
    /// let tokens = Limit::new("tokens", Quota::per_minute(1000))
    ///     .settle(Settle::from_header("x-tokens-used").max_debt(Duration::from_secs(3600)));
    /// assert_eq!(tokens.quota_for("free").max_debt_us(), 3_600_000_000);
    /// ```
    pub fn max_debt(mut self, debt: Duration) -> Settle {
        self.max_debt = Some(debt);
        self
    }

    /// `quota` with this settlement's bound on debts.
    fn debt_of(&self, quota: Quota) -> Quota {
        let most = Duration::from_micros(gcra_core::MAX_WINDOW_US);
        match self.max_debt {
            None => quota.unbounded_debt(),
            Some(debt) => quota
                .try_allow_debt(debt.min(most))
                .unwrap_or_else(|_| quota.unbounded_debt()),
        }
    }

    /// Refunds the whole estimate when the response is a server error
    /// (5xx): a request that failed costs nothing.
    pub fn refund_on_server_error(self) -> Settle {
        self.refund_when(|status| status.is_server_error())
    }

    /// Refunds the whole estimate when `refund` holds for the status.
    pub fn refund_when<F>(mut self, refund: F) -> Settle
    where
        F: Fn(StatusCode) -> bool + Send + Sync + 'static,
    {
        self.refund_on = Some(Arc::new(refund));
        self
    }

    /// Whether the cost is read from the request's [`Usage`] meter.
    pub(crate) fn uses_meter(&self) -> bool {
        matches!(self.actual, Actual::Usage)
    }

    /// What the response head says of the cost: refund everything (a
    /// refusing status), the cost read from the head, or (`None`) not known
    /// before the body ends, or never.
    pub(crate) fn at_head(
        &self,
        response: &http::response::Parts,
    ) -> Option<u32> {
        if self
            .refund_on
            .as_ref()
            .is_some_and(|refund| refund(response.status))
        {
            return Some(0);
        }
        match &self.actual {
            Actual::Head(actual) => actual(response),
            Actual::Trailer(_) | Actual::Usage => None,
        }
    }

    /// The cost in `trailers`, for a trailer-read settlement.
    pub(crate) fn in_trailers(
        &self,
        trailers: &http::HeaderMap,
    ) -> Option<u32> {
        match &self.actual {
            Actual::Trailer(name) => cost_in(trailers.get(name)?),
            _ => None,
        }
    }
}

/// A meter of what a request really cost, for [`Settle::from_usage`]: the
/// layer puts one in the request's extensions; the handler adds to it (or
/// sets it) as it answers, and the settlement reads it when the response
/// body ends. Clones share the count.
///
/// ```
/// let usage = tower_rate_tier::Usage::default();
/// assert_eq!(usage.get(), None);
/// usage.add(100);
/// usage.clone().add(20);
/// assert_eq!(usage.get(), Some(120));
/// usage.set(7);
/// assert_eq!(usage.get(), Some(7));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Usage(Arc<std::sync::atomic::AtomicU64>);

/// [`Usage`]'s count when nothing was recorded.
const UNRECORDED: u64 = 0;
/// Set on a recorded count: 0 is a count too.
const RECORDED: u64 = 1 << 32;

impl Usage {
    /// Adds `units` to the count (saturating at `u32::MAX`).
    pub fn add(&self, units: u32) {
        use std::sync::atomic::Ordering;
        let _ =
            self.0
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                    let count = (now & u64::from(u32::MAX)) as u32;
                    Some(RECORDED | u64::from(count.saturating_add(units)))
                });
    }

    /// Sets the count to `units`.
    pub fn set(&self, units: u32) {
        self.0.store(
            RECORDED | u64::from(units),
            std::sync::atomic::Ordering::Release,
        );
    }

    /// The count, if anything was recorded.
    pub fn get(&self) -> Option<u32> {
        let now = self.0.load(std::sync::atomic::Ordering::Acquire);
        (now != UNRECORDED).then_some((now & u64::from(u32::MAX)) as u32)
    }
}

/// The actual cost of a request, as a response extension, for
/// [`Settle::from_extension`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActualCost(pub u32);
