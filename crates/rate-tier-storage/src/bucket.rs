//! One request against one bucket: [`BucketCheck`], and the names buckets
//! are known by.
//!
//! A bucket is a limit name and a partition: the tier `free` and the user
//! `key_ana`, the limit `search` and the same user, the limit `ip` and an
//! address, a global limit and the empty partition. Every store keys its
//! state by the pair; shared stores see only the partition's hash (see
//! [`crate::key`]).

use std::borrow::Cow;
use std::fmt;

use gcra_core::{Adjust, Charge, CheckError, Decision, Quota};
use siphasher::sip::SipHasher13;

use crate::key::{self, InvalidTierName, KeyLayout, KeySecret};
use crate::rule::Rule;

/// A validated limit (or tier) name: 1 to 64 bytes of `[A-Za-z0-9_.-]`,
/// so that the `:` that ends it in a key is unambiguous and two buckets can
/// never share a key.
///
/// Names live in two namespaces, so that a tier and a limit of the same
/// name never share buckets (a tier reload may add a tier named like a
/// limit): a tier's name ([`LimitName::new`]) is its key part as it is,
/// `trt:free:...`; a limit's of its own ([`LimitName::of_limit`]) is
/// prefixed, `trt:limit/search:...` (`/` is no name's character).
///
/// Validated once, when a configuration is built; a [`BucketCheck`]
/// borrows it, at no cost per request.
///
/// ```
/// use rate_tier_storage::LimitName;
/// let free = LimitName::new("free")?;
/// assert_eq!((free.as_str(), free.key_part()), ("free", "free"));
/// let search = LimitName::of_limit("search")?;
/// assert_eq!((search.as_str(), search.key_part()), ("search", "limit/search"));
/// assert_ne!(LimitName::new("search")?, search);
/// assert!(LimitName::new("a:b").is_err());
/// # Ok::<(), rate_tier_storage::key::InvalidTierName>(())
/// ```
#[derive(Clone)]
pub struct LimitName {
    name: Cow<'static, str>,
    /// What keys and in-process names are made of.
    key_part: Cow<'static, str>,
    /// A fixed 64-bit hash of the key part, made once: an in-process store
    /// mixes it into a bucket's name instead of hashing the name per check.
    id: u64,
}

impl LimitName {
    /// A tier's name (see [`key::validate_tier_name`]).
    pub fn new(
        name: impl Into<Cow<'static, str>>,
    ) -> Result<LimitName, InvalidTierName> {
        let name = name.into();
        key::validate_tier_name(&name)?;
        Ok(Self::with_key_part(name.clone(), name))
    }

    /// The name of a limit of its own (an endpoint's, an address's), in
    /// the limits' namespace: never a tier's buckets.
    pub fn of_limit(
        name: impl Into<Cow<'static, str>>,
    ) -> Result<LimitName, InvalidTierName> {
        let name = name.into();
        key::validate_tier_name(&name)?;
        let key_part = Cow::Owned(format!("limit/{name}"));
        Ok(Self::with_key_part(name, key_part))
    }

    /// The name of a shaper's quota (an outgoing call's, see
    /// `tower_rate_tier::shape::ShapeLayer`): keyed apart from tiers and limits,
    /// so a quota `search` of a shaper is never the limit `search`.
    ///
    /// ```
    /// use rate_tier_storage::LimitName;
    /// let name = LimitName::of_shaper("per-second")?;
    /// assert_eq!((name.as_str(), name.key_part()), ("per-second", "shape/per-second"));
    /// assert_ne!(name, LimitName::of_limit("per-second")?);
    /// # Ok::<(), rate_tier_storage::key::InvalidTierName>(())
    /// ```
    pub fn of_shaper(
        name: impl Into<Cow<'static, str>>,
    ) -> Result<LimitName, InvalidTierName> {
        let name = name.into();
        key::validate_tier_name(&name)?;
        let key_part = Cow::Owned(format!("shape/{name}"));
        Ok(Self::with_key_part(name, key_part))
    }

    /// The name of a ban's bucket (`tower_rate_tier::Ban`): `part` is
    /// `until`, `refusals` or `level`, keyed apart from tiers, limits and
    /// shapers.
    ///
    /// ```
    /// use rate_tier_storage::LimitName;
    /// let until = LimitName::of_ban("until")?;
    /// assert_eq!((until.as_str(), until.key_part()), ("ban", "ban/until"));
    /// # Ok::<(), rate_tier_storage::key::InvalidTierName>(())
    /// ```
    pub fn of_ban(part: &'static str) -> Result<LimitName, InvalidTierName> {
        key::validate_tier_name(part)?;
        let key_part = Cow::Owned(format!("ban/{part}"));
        Ok(Self::with_key_part(Cow::Borrowed("ban"), key_part))
    }

    fn with_key_part(
        name: Cow<'static, str>,
        key_part: Cow<'static, str>,
    ) -> LimitName {
        let id = SipHasher13::new_with_keys(0x7472_745f, 0x6c69_6d69)
            .hash(key_part.as_bytes());
        LimitName { name, key_part, id }
    }

    /// The same name (the same keys in Redis and PostgreSQL, and equal to
    /// this one) in its `generation`-th configuration of another kind: an
    /// in-process store keeps each generation's buckets apart. A limit
    /// whose kind a reload changed starts fresh there, as it does in a
    /// shared store (whose key then holds a value of another type, read
    /// as absent), even when a later reload changes it back while its
    /// buckets of the first kind still live. Generation 0 is this name.
    ///
    /// ```
    /// use rate_tier_storage::{BucketCheck, Decision, LimitName, MemoryStorage, Quota};
    /// let store = MemoryStorage::new();
    /// let free = LimitName::new("free")?;
    /// let quota = Quota::per_minute(1);
    /// let mut out = [Decision::default()];
    /// let check = |name| BucketCheck::new(name, "ana", quota, 1);
    /// assert!(store.check_sync(&[check(&free)?], &mut out)?.verdict.allowed);
    /// assert!(!store.check_sync(&[check(&free)?], &mut out)?.verdict.allowed);
    ///
    /// let third = free.in_generation(2);
    /// assert_eq!(third, free); // the same keys
    /// assert_eq!(free.in_generation(0).key_part(), "free");
    /// assert!(store.check_sync(&[check(&third)?], &mut out)?.verdict.allowed);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn in_generation(&self, generation: u32) -> LimitName {
        let mut named = self.clone();
        if generation > 0 {
            let mut hasher =
                SipHasher13::new_with_keys(0x7472_745f, 0x6c69_6d69);
            std::hash::Hasher::write(&mut hasher, self.key_part.as_bytes());
            std::hash::Hasher::write_u32(&mut hasher, generation);
            named.id = std::hash::Hasher::finish(&hasher);
        }
        named
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// What keys are made of: the name, or `limit/` and the name for a
    /// limit of its own.
    pub fn key_part(&self) -> &str {
        &self.key_part
    }

    /// The key part's fixed hash (not keyed: names come from configuration).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }
}

impl PartialEq for LimitName {
    fn eq(&self, other: &Self) -> bool {
        self.key_part == other.key_part
    }
}

impl Eq for LimitName {}

impl std::hash::Hash for LimitName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key_part.hash(state);
    }
}

impl fmt::Debug for LimitName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.name, f)
    }
}

impl fmt::Display for LimitName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// One request against one bucket: which bucket, under which quota, at what
/// cost, enforced or in shadow.
///
/// Built once per request at the edge, where the cost is validated: a
/// `BucketCheck` that exists has a cost of 0 (a peek) up to the quota's
/// burst, so no store checks it again.
///
/// ```
/// use rate_tier_storage::{BucketCheck, KeyLayout, LimitName};
/// use rate_tier_storage::key::KeySecret;
/// use gcra_core::{CheckError, Quota};
///
/// let pro = LimitName::new("pro")?;
/// let secret = KeySecret::new("k")?;
/// let check = BucketCheck::new(&pro, "bea", Quota::per_minute(100), 5)?
///     .key_secret(Some(&secret));
/// assert!(check.key(KeyLayout::Single).starts_with("trt:pro:"));
///
/// // A cost that can never pass is refused here, before any store.
/// assert_eq!(
///     BucketCheck::new(&pro, "bea", Quota::per_minute(100), 101).unwrap_err(),
///     CheckError::CostExceedsBurst { cost: 101, burst: 100 }
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct BucketCheck<'a> {
    name: &'a LimitName,
    partition: &'a str,
    rule: Rule,
    cost: u32,
    shadow: bool,
    key_secret: Option<&'a KeySecret>,
    /// The request's slots of a concurrency limit, on a store that keeps
    /// one lease per slot: 0 when none was given.
    lease_id: u64,
}

impl<'a> BucketCheck<'a> {
    /// `cost` against the bucket (`name`, `partition`) under `quota`.
    ///
    /// # Errors
    ///
    /// [`CheckError::CostExceedsBurst`] if `cost` is above the quota's
    /// burst: no wait would let it pass. A cost of 0 is a peek.
    pub fn new(
        name: &'a LimitName,
        partition: &'a str,
        quota: Quota,
        cost: u32,
    ) -> Result<Self, CheckError> {
        if cost > quota.burst() {
            return Err(CheckError::CostExceedsBurst {
                cost,
                burst: quota.burst(),
            });
        }
        Ok(BucketCheck {
            name,
            partition,
            rule: Rule::Rate(quota),
            cost,
            shadow: false,
            key_secret: None,
            lease_id: 0,
        })
    }

    /// `cost` against the bucket (`name`, `partition`) under a rule of any
    /// kind: a rate, as [`BucketCheck::new`], a window or a period. Only a
    /// store that [`supports`](crate::Capabilities::supports) the rule's kind
    /// decides it; the others answer [`StorageError::Unsupported`](crate::StorageError::Unsupported).
    ///
    /// ```
    /// use std::time::Duration;
    /// use rate_tier_storage::{BucketCheck, LimitName, RuleKind};
    /// use gcra_core::{CheckError, Window};
    ///
    /// let login = LimitName::of_limit("login")?;
    /// let window = Window::new(5, Duration::from_secs(60))?;
    /// let check = BucketCheck::of_rule(&login, "ana", window.into(), 1)?;
    /// assert_eq!(check.rule().kind(), RuleKind::Window);
    /// assert_eq!(
    ///     BucketCheck::of_rule(&login, "ana", window.into(), 6).unwrap_err(),
    ///     CheckError::CostExceedsBurst { cost: 6, burst: 5 }
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`CheckError::CostExceedsBurst`] if `cost` is above the rule's
    /// [`limit`](Rule::limit).
    pub fn of_rule(
        name: &'a LimitName,
        partition: &'a str,
        rule: Rule,
        cost: u32,
    ) -> Result<Self, CheckError> {
        rule.admits(cost)?;
        Ok(BucketCheck {
            name,
            partition,
            rule,
            cost,
            shadow: false,
            key_secret: None,
            lease_id: 0,
        })
    }

    /// A read of the bucket that charges nothing (a cost of 0).
    pub fn peek(name: &'a LimitName, partition: &'a str, quota: Quota) -> Self {
        BucketCheck {
            name,
            partition,
            rule: Rule::Rate(quota),
            cost: 0,
            shadow: false,
            key_secret: None,
            lease_id: 0,
        }
    }

    /// In shadow mode: decided and reported, never refusing (see
    /// [`gcra_core::Charge::shadow`]).
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// The id of the slots this check takes on a concurrency limit, for a
    /// store that keeps a lease per slot ([`Capabilities::lease`](crate::Capabilities::lease)):
    /// the same id releases and renews them. Unique per request (a random
    /// 64-bit number); ignored by other kinds and by the memory store.
    ///
    /// ```
    /// use rate_tier_storage::{BucketCheck, Concurrency, LimitName};
    /// let uploads = LimitName::of_limit("uploads")?;
    /// let slot = BucketCheck::of_rule(&uploads, "ana", Concurrency::new(2)?.into(), 1)?
    ///     .lease_id(0x5eed);
    /// assert_eq!(slot.lease(), 0x5eed);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn lease_id(mut self, id: u64) -> Self {
        self.lease_id = id;
        self
    }

    /// The id of [`BucketCheck::lease_id`]; 0 when none was given.
    pub fn lease(&self) -> u64 {
        self.lease_id
    }

    /// The secret that turns the partition into an HMAC in shared keys.
    pub fn key_secret(mut self, secret: Option<&'a KeySecret>) -> Self {
        self.key_secret = secret;
        self
    }

    /// The limit's name.
    pub fn name(&self) -> &'a str {
        self.name.as_str()
    }

    /// The limit's name, validated.
    pub fn limit_name(&self) -> &'a LimitName {
        self.name
    }

    /// The partition (a user id, an address, `""` for a global limit).
    pub fn partition(&self) -> &'a str {
        self.partition
    }

    /// The quota of a rate. For a window or a period (see
    /// [`BucketCheck::rule`]): a nominal rate of its limit per its length,
    /// for reports only.
    #[inline]
    pub fn quota(&self) -> Quota {
        self.rule.as_quota()
    }

    /// What the bucket enforces.
    pub fn rule(&self) -> Rule {
        self.rule
    }

    /// Whether the bucket enforces a GCRA rate (the kind every store
    /// decides).
    pub fn is_rate(&self) -> bool {
        matches!(self.rule, Rule::Rate(_))
    }

    /// The cost, `0..=quota.burst()`; 0 is a peek.
    pub fn cost(&self) -> u32 {
        self.cost
    }

    /// Whether it is in shadow mode.
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// The same bucket, read only (a cost of 0).
    ///
    /// ```
    /// use rate_tier_storage::{BucketCheck, LimitName};
    /// use gcra_core::Quota;
    /// let free = LimitName::new("free")?;
    /// let check = BucketCheck::new(&free, "ana", Quota::per_minute(10), 3)?;
    /// assert_eq!(check.as_peek().cost(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_peek(mut self) -> Self {
        self.cost = 0;
        self
    }

    /// What this check's charge would have met, from a read of its bucket
    /// ([`Charge::would_meet`]).
    pub fn would_meet(&self, peek: &Decision) -> Decision {
        self.charge().would_meet(peek)
    }

    /// The same bucket under another quota (a fallback's local share), the
    /// cost unchanged and not validated again.
    pub(crate) fn with_quota(mut self, quota: Quota) -> Self {
        self.rule = Rule::Rate(quota);
        self
    }

    /// The same bucket under another rule of its kind (a fallback's local
    /// share), the cost unchanged and not validated again.
    pub(crate) fn with_rule(mut self, rule: Rule) -> Self {
        self.rule = rule;
        self
    }

    /// What gcra-core decides for this bucket.
    pub fn charge(&self) -> Charge {
        Charge {
            quota: self.quota(),
            cost: self.cost,
            shadow: self.shadow,
        }
    }

    /// The bucket's key in a shared store laid out as `layout`: see
    /// [`key::bucket_key`] and [`key::cluster_bucket_key`].
    pub fn key(&self, layout: KeyLayout) -> String {
        key::shared_key(
            layout,
            self.name.key_part(),
            self.partition,
            self.key_secret,
        )
    }

    /// The secret of its shared keys, if any.
    pub fn secret(&self) -> Option<&'a KeySecret> {
        self.key_secret
    }

    /// The script arguments of this bucket: `T`, `tau`, cost, 1 for a
    /// shadow limit (0 otherwise), and the most debt a settlement may leave
    /// ([`Quota::max_debt_us`]), as every Redis script of this crate takes
    /// them.
    pub fn script_args(&self) -> [u64; 5] {
        script_args(&self.charge())
    }

    /// The reservation of this bucket that wrote `tat_us`, to give back
    /// ([`StorageExt::cancel`](crate::StorageExt::cancel)), taken by the store
    /// itself ([`Charged::Primary`]; see [`BucketCancel::charged`]).
    pub fn cancel(self, tat_us: u64) -> BucketCancel<'a> {
        BucketCancel {
            bucket: self,
            tat_us,
            charged: Charged::Primary,
        }
    }

    /// An adjustment of this bucket after the request (see
    /// [`gcra_core::Quota::settle`]), charged by the store itself
    /// ([`Charged::Primary`]; see [`BucketSettle::charged`]).
    pub fn settle(self, adjust: Adjust) -> BucketSettle<'a> {
        BucketSettle {
            bucket: self,
            adjust,
            charged: Charged::Primary,
        }
    }
}

/// A reservation to give back ([`StorageExt::cancel`](crate::StorageExt::cancel)):
/// the bucket as it was reserved, and the TAT the reservation wrote
/// (its [`Decision`]'s `store`).
///
/// ```
/// use rate_tier_storage::{BucketCheck, LimitName, Quota};
/// let name = LimitName::new("provider")?;
/// let check = BucketCheck::new(&name, "", Quota::per_second(10), 1)?;
/// let cancel = check.cancel(1_100_000);
/// assert_eq!(cancel.tat_us, 1_100_000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct BucketCancel<'a> {
    /// The bucket and the cost it reserved.
    pub bucket: BucketCheck<'a>,
    /// The TAT the reservation wrote: given back only while it is the
    /// stored one.
    pub tat_us: u64,
    /// Which store took it (behind a fallback).
    pub charged: Charged,
}

impl BucketCancel<'_> {
    /// The same, taken by `charged`.
    #[must_use]
    pub fn charged(mut self, charged: Charged) -> Self {
        self.charged = charged;
        self
    }

    /// The write that gives it back, given the bucket's stored TAT at
    /// `now_us` ([`gcra_core::Quota::cancel`]).
    pub fn write(
        &self,
        stored_tat_us: Option<u64>,
        now_us: u64,
    ) -> gcra_core::Write {
        let reservation = gcra_core::Reservation {
            wait_us: 0,
            cost: self.bucket.cost(),
            store: gcra_core::StoreTat {
                tat_us: self.tat_us,
                ttl_ms: 0,
            },
        };
        self.bucket
            .quota()
            .cancel(stored_tat_us, now_us, &reservation)
    }
}

/// A charge adjusted after the request was served: the estimate charged by a
/// [`BucketCheck`] becomes the actual cost.
#[derive(Debug, Clone, Copy)]
pub struct BucketSettle<'a> {
    /// The bucket (its cost is not used).
    pub bucket: BucketCheck<'a>,
    /// The debt to charge, or the units to give back.
    pub adjust: Adjust,
    /// Where the estimate was charged ([`Decided::charged`](crate::Decided::charged)):
    /// a fallback settles it there, whatever its breaker says now.
    pub charged: Charged,
}

impl BucketSettle<'_> {
    /// The same settlement, of an estimate charged at `charged`.
    ///
    /// ```
    /// use rate_tier_storage::{Adjust, BucketCheck, Charged, LimitName};
    /// use gcra_core::Quota;
    /// let tokens = LimitName::new("tokens")?;
    /// let settle = BucketCheck::peek(&tokens, "ana", Quota::per_minute(1000))
    ///     .settle(Adjust::Refund(3))
    ///     .charged(Charged::Local { share: 1 });
    /// assert_eq!(settle.charged, Charged::Local { share: 1 });
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn charged(mut self, charged: Charged) -> Self {
        self.charged = charged;
        self
    }
}

/// The script arguments of a charge: see [`BucketCheck::script_args`].
pub(crate) fn script_args(charge: &Charge) -> [u64; 5] {
    [
        charge.quota.emission_interval_us(),
        charge.quota.burst_offset_us(),
        u64::from(charge.cost),
        u64::from(charge.shadow),
        charge.quota.max_debt_us(),
    ]
}

/// Several checks are one decision only if no bucket appears twice: a store
/// would decide it twice from the same stored state.
pub(crate) fn distinct(checks: &[BucketCheck<'_>]) -> bool {
    if checks.len() < 2 {
        return true;
    }
    checks.iter().enumerate().all(|(i, a)| {
        checks[..i]
            .iter()
            .all(|b| a.name != b.name || a.partition != b.partition)
    })
}

/// Where a bucket was charged, so that a settlement of it goes to the same
/// store: a refund to a store that never charged would hand out quota, and
/// a debt sent elsewhere would be lost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Charged {
    /// By the store itself (the primary of a fallback: Redis).
    #[default]
    Primary,
    /// By a fallback's local store, under quotas divided by `share`.
    Local {
        /// The fallback's local share when it decided.
        share: u32,
    },
}
