//! What a decision says: [`RateLimitInfo`] for a request that passes,
//! [`Limited`] for one that does not, and each limit's [`LimitState`].

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use std::fmt;

use gcra_core::Quota;
use rate_tier_storage::{Charged, LimitName, Rule};

use crate::tiers::StaticName;
use smallvec::SmallVec;

/// Every limit of a decision with more than the tier's enforced limit; the
/// tier's alone is described by the outcome's own fields (no allocation on
/// the common path). A thin pointer to one allocation: the outcome is moved
/// a few times per check, and every word of it counts.
pub(crate) type States = Option<Arc<Kept>>;

/// A decision's states as kept: whole, or as the few words rates charged
/// in place leave, made whole when read (most answers are never asked for
/// their limits).
#[derive(Clone)]
pub(crate) enum Kept {
    Whole(SmallVec<[LimitState; 3]>),
    Rates(SmallVec<[RatePart; 4]>),
}

/// What an enforced rate charged in place leaves of its [`LimitState`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct RatePart {
    pub(crate) key: &'static LimitName,
    pub(crate) quota: Quota,
    pub(crate) remaining: u64,
    pub(crate) reset_after_us: u64,
}

impl RatePart {
    fn state(&self) -> LimitState {
        LimitState {
            charged: Charged::Primary,
            name: self.key.as_str_static(),
            limit: self.quota.burst(),
            remaining: self.remaining,
            reset_after: Duration::from_micros(self.reset_after_us),
            window: Duration::from_micros(self.quota.burst_offset_us()),
            shadow: false,
            shadow_limited: false,
            rule: Some(Rule::Rate(self.quota)),
        }
    }
}

impl Kept {
    fn iter(&self) -> Many<'_> {
        match self {
            Kept::Whole(states) => Many::Whole(states.iter()),
            Kept::Rates(parts) => Many::Rates(parts.iter()),
        }
    }

    /// The most constraining limit's name (see [`most_constraining`]).
    fn most_constraining_name(&self) -> &'static str {
        match self {
            Kept::Whole(states) => states
                .get(most_constraining(states))
                .map_or("", |state| state.name),
            // Enforced rates all: the first with the fewest left.
            Kept::Rates(parts) => parts
                .iter()
                .min_by_key(|part| part.remaining)
                .map_or("", |part| part.key.as_str_static()),
        }
    }
}

impl fmt::Debug for Kept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq for Kept {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for Kept {}

thread_local! {
    /// The last states this thread made: reused when every outcome that
    /// held them is gone (the usual case), so that a decision over several
    /// limits does not allocate and free each time.
    static SPARE: std::cell::RefCell<Option<Arc<Kept>>> =
        const { std::cell::RefCell::new(None) };
}

/// The states `write` leaves, shared: written in this thread's spare
/// allocation when no outcome holds it any more, else in a new one (which
/// becomes the spare).
#[inline]
fn shared(write: impl Fn(&mut Kept)) -> Arc<Kept> {
    let fresh = || {
        let mut kept = Kept::Rates(SmallVec::new());
        write(&mut kept);
        Arc::new(kept)
    };
    SPARE
        .try_with(|spare| {
            let mut spare = spare.try_borrow_mut().ok()?;
            match spare.as_mut().and_then(Arc::get_mut) {
                Some(held) => write(held),
                None => *spare = Some(fresh()),
            }
            spare.clone()
        })
        .ok()
        .flatten()
        .unwrap_or_else(fresh)
}

/// `states`, shared (see [`shared`]).
pub(crate) fn shared_states(states: &[LimitState]) -> Arc<Kept> {
    shared(|kept| match kept {
        // Usually as many as last time: written over in place.
        Kept::Whole(held) if held.len() == states.len() => {
            held.copy_from_slice(states);
        }
        _ => *kept = Kept::Whole(SmallVec::from_slice(states)),
    })
}

/// The parts `make` gives for `0..count`, shared (see [`shared`]) and
/// made where they are kept.
#[inline]
pub(crate) fn shared_rates_with(
    count: usize,
    make: impl Fn(usize) -> RatePart,
) -> Arc<Kept> {
    shared(|kept| match kept {
        Kept::Rates(held) if held.len() == count => {
            for (i, part) in held.iter_mut().enumerate() {
                *part = make(i);
            }
        }
        _ => *kept = Kept::Rates((0..count).map(&make).collect()),
    })
}

/// One limit's state after a decision: the tier's, or a limit of its own
/// (an endpoint's, an address's).
///
/// ```
/// use tower_rate_tier::{Quota, RateTier};
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let limiter = RateTier::builder().tier("free", Quota::per_minute(10)).build();
/// let info = limiter.check("ana", "free", 4).await.unwrap().unwrap();
/// let tier = info.limits().next().unwrap();
/// assert_eq!((tier.name, tier.limit, tier.remaining), ("free", 10, 6));
/// assert_eq!(tier.window, std::time::Duration::from_secs(60));
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimitState {
    /// The tier (for the tier's limit) or the limit's name.
    pub name: &'static str,
    /// Its burst: requests of cost 1 a full bucket allows at once.
    pub limit: u32,
    /// Requests of cost 1 still allowed right now.
    pub remaining: u64,
    /// Until the bucket is full again; for a window or a concurrency limit
    /// that refused, until the request may be retried (a window is full
    /// again only when its newest request leaves it, and when a slot frees
    /// no store can foresee).
    pub reset_after: Duration,
    /// How long a full burst takes to come back (`tau = T * burst`): the
    /// window of the IETF `RateLimit-Policy`.
    pub window: Duration,
    /// Whether the limit is in shadow mode: decided and reported, never
    /// refusing.
    pub shadow: bool,
    /// A shadow limit that would have refused this request.
    pub shadow_limited: bool,
    /// Where its bucket was charged: a settlement of it goes there
    /// (see [`Charged`]).
    pub charged: Charged,
    /// The rule its bucket was decided under (a customer's own quota where
    /// one replaced the configured rule): a settlement of it uses this
    /// rule ([`RateTier::settle`](crate::RateTier::settle)). `None` where
    /// the outcome's own fields tell the tier's limit alone.
    pub(crate) rule: Option<rate_tier_storage::Rule>,
}

impl LimitState {
    /// Unix time, in whole seconds rounded up, when this bucket is full
    /// again, for a decision made at `now_us` (as
    /// [`RateLimitInfo::now_us`] says).
    pub fn reset_unix_secs(&self, now_us: u64) -> u64 {
        unix_secs_after(now_us, self.reset_after)
    }
}

/// The state of the limits after an allowed request.
///
/// The fields describe the most constraining limit (the least remaining;
/// the tier's when there is no other): what the `x-ratelimit-*` headers
/// show. [`RateLimitInfo::limits`] has every limit of the decision.
///
/// ```
/// use tower_rate_tier::{Quota, RateTier};
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let limiter = RateTier::builder().tier("free", Quota::per_minute(10)).build();
/// let info = limiter.check("ana", "free", 3).await.unwrap().unwrap();
/// assert_eq!((info.limit, info.remaining), (10, 7));
/// assert_eq!(&*info.tier, "free");
/// assert_eq!(info.reset_after, std::time::Duration::from_secs(18));
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimitInfo {
    /// The tier whose quota applied (the default tier for an unknown one,
    /// or the claimed tier when `OnUnknownTier::Allow` let it pass).
    pub tier: Cow<'static, str>,
    /// The burst of the most constraining limit.
    pub limit: u32,
    /// Requests of cost 1 still allowed right now by it.
    pub remaining: u64,
    /// Until its bucket is full again.
    pub reset_after: Duration,
    /// The cost charged to the tier.
    pub cost: u32,
    /// How long a full burst takes to come back (`tau = T * burst`).
    pub window: Duration,
    /// When this was decided, in µs on the limiter's clock.
    pub now_us: u64,
    /// `None`: the tier's enforced limit alone, told by the fields above
    /// (its name is the tier's).
    pub(crate) limits: States,
}

/// A request the limiter let through: its [`RateLimitInfo`] (through
/// `Deref`), and the slots of the concurrency limits it took, given back
/// when this is dropped. The info is a plain value: a copy of it kept by a
/// handler holds no slot.
///
/// ```
/// use tower_rate_tier::{Concurrency, RateTier};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = RateTier::builder().tier("uploads", Concurrency::new(1)?).build();
/// let admitted = limiter.check("ana", "uploads", 1).await?.unwrap();
/// let info = admitted.info().clone();
/// assert!(limiter.check("ana", "uploads", 1).await?.is_err());
/// drop(admitted); // the slot is given back; `info` held none
/// assert!(limiter.check("ana", "uploads", 1).await?.is_ok());
/// assert_eq!((info.limit, info.remaining), (1, 0));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Admitted {
    pub(crate) info: RateLimitInfo,
    pub(crate) slots: Option<std::sync::Arc<crate::limiter::slots::Slots>>,
}

impl Admitted {
    /// A request that holds no slot.
    #[inline(always)]
    pub(crate) fn new(info: RateLimitInfo) -> Self {
        Admitted { info, slots: None }
    }

    /// What the decision said.
    pub fn info(&self) -> &RateLimitInfo {
        &self.info
    }
}

impl std::ops::Deref for Admitted {
    type Target = RateLimitInfo;

    fn deref(&self) -> &RateLimitInfo {
        &self.info
    }
}

impl RateLimitInfo {
    /// Every limit of the decision, the tier's first.
    ///
    /// ```
    /// use tower_rate_tier::{Limit, LimitRequest, Quota, RateTier};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let limiter = RateTier::builder().tier("free", Quota::per_minute(10)).build();
    /// let search = Limit::new("search", Quota::per_minute(3));
    /// let request = LimitRequest::new("ana", "free", 1).limit(&search, 1);
    /// let info = limiter.decide(&request).await.unwrap().unwrap();
    /// let names: Vec<&str> = info.limits().map(|l| l.name).collect();
    /// assert_eq!(names, ["free", "search"]);
    /// assert_eq!(info.limit_name(), "search"); // 2 left, the tier 9
    /// # }
    /// ```
    pub fn limits(&self) -> LimitStates<'_> {
        LimitStates::new(&self.limits, || LimitState {
            name: self.limit_name(),
            limit: self.limit,
            remaining: self.remaining,
            reset_after: self.reset_after,
            window: self.window,
            shadow: false,
            shadow_limited: false,
            charged: Charged::Primary,
            rule: None,
        })
    }

    /// Whether a limit in shadow mode would have refused the request.
    pub fn shadow_limited(&self) -> bool {
        self.limits().any(|limit| limit.shadow_limited)
    }

    /// The name of the most constraining limit (the tier's name for its own limit).
    pub fn limit_name(&self) -> &'static str {
        match (&self.limits, &self.tier) {
            (Some(limits), _) => limits.most_constraining_name(),
            // A configured tier; a claimed one let through is no limit.
            (None, Cow::Borrowed(tier)) => tier,
            (None, Cow::Owned(_)) => "",
        }
    }

    /// Unix time, in whole seconds rounded up, when the most constraining
    /// bucket is full again (the `x-ratelimit-reset` header).
    ///
    /// ```
    /// # use tower_rate_tier::{Quota, RateTier, clock::FakeClock};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let clock = FakeClock::at_us(1_500_000); // t = 1.5 s
    /// let limiter = RateTier::builder().clock(clock).tier("t", Quota::per_second(1)).build();
    /// let info = limiter.check("u", "t", 1).await.unwrap().unwrap();
    /// assert_eq!(info.reset_unix_secs(), 3); // full again at 2.5 s: rounded up
    /// # }
    /// ```
    pub fn reset_unix_secs(&self) -> u64 {
        unix_secs_after(self.now_us, self.reset_after)
    }

    /// What a peek of a tier that is denied reads: nothing allowed.
    pub(crate) fn nothing(tier: &str, now_us: u64) -> Self {
        RateLimitInfo {
            limit: 0,
            remaining: 0,
            ..RateLimitInfo::unlimited(tier, 0, now_us)
        }
    }

    /// The passing answer of an explicit `Allow` policy: no limit applied.
    pub(crate) fn unlimited(tier: &str, cost: u32, now_us: u64) -> Self {
        RateLimitInfo {
            tier: Cow::Owned(tier.to_owned()),
            limit: u32::MAX,
            remaining: u64::MAX,
            reset_after: Duration::ZERO,
            cost,
            window: Duration::ZERO,
            now_us,
            limits: None,
        }
    }
}

/// The enforced limit with the least remaining (the first on a tie, so the
/// tier's when they are equal).
pub(crate) fn most_constraining(limits: &[LimitState]) -> usize {
    let mut most = 0;
    for (i, state) in limits.iter().enumerate() {
        let best = limits.get(most);
        let better = match best {
            Some(best) if best.shadow && !state.shadow => true,
            Some(best) => !state.shadow && state.remaining < best.remaining,
            None => true,
        };
        if better {
            most = i;
        }
    }
    most
}

/// The limits of a decision, as [`RateLimitInfo::limits`] and
/// [`Limited::limits`] give them.
#[derive(Debug, Clone)]
pub struct LimitStates<'a> {
    one: Option<LimitState>,
    many: Many<'a>,
}

/// The states of [`Kept`], made whole as they are read.
#[derive(Debug, Clone)]
enum Many<'a> {
    Whole(std::slice::Iter<'a, LimitState>),
    Rates(std::slice::Iter<'a, RatePart>),
}

impl Iterator for Many<'_> {
    type Item = LimitState;

    #[inline]
    fn next(&mut self) -> Option<LimitState> {
        match self {
            Many::Whole(states) => states.next().copied(),
            Many::Rates(parts) => parts.next().map(RatePart::state),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let len = match self {
            Many::Whole(states) => states.len(),
            Many::Rates(parts) => parts.len(),
        };
        (len, Some(len))
    }
}

impl<'a> LimitStates<'a> {
    fn new(
        limits: &'a States,
        one: impl FnOnce() -> LimitState,
    ) -> LimitStates<'a> {
        match limits {
            Some(many) => LimitStates {
                one: None,
                many: many.iter(),
            },
            None => LimitStates {
                one: Some(one()),
                many: Many::Whole([].iter()),
            },
        }
    }

    fn none() -> LimitStates<'a> {
        LimitStates {
            one: None,
            many: Many::Whole([].iter()),
        }
    }
}

impl Iterator for LimitStates<'_> {
    type Item = LimitState;

    fn next(&mut self) -> Option<LimitState> {
        self.one.take().or_else(|| self.many.next())
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let len = usize::from(self.one.is_some()) + self.many.size_hint().0;
        (len, Some(len))
    }
}

impl ExactSizeIterator for LimitStates<'_> {}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimitReason {
    /// The bucket is empty for now: retry after [`Limited::retry_after`]
    /// (HTTP 429).
    RateLimited,
    /// The customer is banned ([`RateTierBuilder::ban`](crate::RateTierBuilder::ban)):
    /// every request is refused until the ban ends, after
    /// [`Limited::retry_after`] (HTTP 429, `"banned": true`).
    Banned,
    /// The cost is above the limit's burst: no wait would make it pass
    /// (HTTP 403). The store was not touched.
    CostExceedsBurst {
        /// The cost asked for.
        cost: u32,
    },
    /// The tier is unknown and the policy is
    /// [`OnUnknownTier::Deny`](crate::policy::OnUnknownTier::Deny) (HTTP 403).
    UnknownTier,
}

/// A refused request.
///
/// ```
/// use tower_rate_tier::{LimitReason, Quota, RateTier};
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let limiter = RateTier::builder().tier("free", Quota::per_minute(10)).build();
/// let never = limiter.check("ana", "free", 50).await.unwrap().unwrap_err();
/// assert_eq!(never.reason(), LimitReason::CostExceedsBurst { cost: 50 });
/// assert!(!never.can_retry());
///
/// limiter.check("ana", "free", 10).await.unwrap().unwrap();
/// let limited = limiter.check("ana", "free", 1).await.unwrap().unwrap_err();
/// assert_eq!(limited.reason(), LimitReason::RateLimited);
/// assert!(limited.retry_after() <= std::time::Duration::from_secs(6));
/// assert_eq!(limited.retry_after_secs(), 6); // rounded up
/// # }
/// ```
///
/// Kept small (times in µs, the name borrowed): it is moved a few times on
/// its way out of a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limited {
    pub(crate) tier: Cow<'static, str>,
    /// The refusing limit's name; `None`: the tier's, a claimed one (an
    /// unknown tier denied).
    pub(crate) name: Option<&'static str>,
    pub(crate) limit: u32,
    pub(crate) reason: LimitReason,
    pub(crate) retry_after_us: u64,
    pub(crate) reset_after_us: u64,
    pub(crate) now_us: u64,
    pub(crate) window_us: u64,
    pub(crate) limits: States,
}

impl Limited {
    /// Why the request was refused.
    pub fn reason(&self) -> LimitReason {
        self.reason
    }

    /// Whether waiting helps: only for [`LimitReason::RateLimited`].
    pub fn can_retry(&self) -> bool {
        matches!(self.reason, LimitReason::RateLimited | LimitReason::Banned)
    }

    /// How long until the same request would pass; zero when it never will
    /// (see [`Limited::can_retry`]). With several limits, the longest wait
    /// among those that refused.
    pub fn retry_after(&self) -> Duration {
        Duration::from_micros(self.retry_after_us)
    }

    /// [`Limited::retry_after`] in whole seconds, rounded up: a client that
    /// waits exactly this long is not refused again.
    pub fn retry_after_secs(&self) -> u64 {
        ceil_secs(self.retry_after())
    }

    /// The tier of the request.
    pub fn tier(&self) -> &str {
        &self.tier
    }

    /// The limit that refused: the tier's name for the tier's own limit,
    /// or a limit's name (`"search"`).
    pub fn limit_name(&self) -> &str {
        self.name.unwrap_or(&self.tier)
    }

    /// Whether the tier's own limit refused (not a limit of its own).
    pub fn is_tier_limit(&self) -> bool {
        self.limit_name() == self.tier
    }

    /// The refusing limit's burst (the `x-ratelimit-limit`).
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Until the refusing limit's bucket is full again.
    pub fn reset_after(&self) -> Duration {
        Duration::from_micros(self.reset_after_us)
    }

    /// How long a full burst of the refusing limit takes to come back.
    pub fn window(&self) -> Duration {
        Duration::from_micros(self.window_us)
    }

    /// Every limit of the decision, the tier's first (none when the
    /// request was refused before any bucket was read).
    pub fn limits(&self) -> LimitStates<'_> {
        if self.reason != LimitReason::RateLimited {
            return LimitStates::none();
        }
        LimitStates::new(&self.limits, || LimitState {
            name: self.name.unwrap_or(""),
            limit: self.limit,
            remaining: 0,
            reset_after: self.reset_after(),
            window: self.window(),
            shadow: false,
            shadow_limited: false,
            charged: Charged::Primary,
            rule: None,
        })
    }

    /// Unix time, in whole seconds rounded up, when the refusing bucket is
    /// full again.
    pub fn reset_unix_secs(&self) -> u64 {
        unix_secs_after_us(self.now_us, self.reset_after_us)
    }
}

/// Whole seconds, rounded up: a client that waits this long is not early.
///
/// ```
/// # use std::time::Duration;
/// assert_eq!(tower_rate_tier::headers::ceil_secs(Duration::from_millis(5_001)), 6);
/// assert_eq!(tower_rate_tier::headers::ceil_secs(Duration::from_secs(6)), 6);
/// ```
pub fn ceil_secs(duration: Duration) -> u64 {
    let secs = duration.as_secs();
    if duration.subsec_nanos() > 0 {
        secs.saturating_add(1)
    } else {
        secs
    }
}

/// The Unix second, rounded up, `after` past `now_us`.
pub(crate) fn unix_secs_after(now_us: u64, after: Duration) -> u64 {
    let after_us = u64::try_from(after.as_micros()).unwrap_or(u64::MAX);
    unix_secs_after_us(now_us, after_us)
}

/// The Unix second, rounded up, `after_us` past `now_us`.
fn unix_secs_after_us(now_us: u64, after_us: u64) -> u64 {
    now_us.saturating_add(after_us).div_ceil(1_000_000)
}
