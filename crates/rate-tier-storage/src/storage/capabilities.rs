//! [`Capabilities`]: what a store decides, and how.

use std::time::Duration;

use crate::rule::RuleKind;

/// What a store decides and how, as [`Storage::capabilities`](crate::Storage::capabilities) says.
///
/// ```
/// use rate_tier_storage::{Capabilities, RuleKind};
/// let custom = Capabilities::new("dynamodb").with(RuleKind::Window);
/// assert!(custom.supports(RuleKind::Rate) && custom.supports(RuleKind::Window));
/// assert!(!custom.supports(RuleKind::Period) && !custom.reserves);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// A short label for metrics and logs, e.g. `"memory"` or `"redis"`.
    pub label: &'static str,
    /// The kinds decided, one bit per [`RuleKind`] (see
    /// [`Capabilities::supports`]); rates always.
    kinds: u8,
    /// Whether one decision may hold windows, periods or concurrency
    /// limits of different partitions (a user's beside a global bucket).
    /// False on a Redis Cluster, where each partition's buckets live in a
    /// hash slot of their own and a window's or a period's charge cannot
    /// be refunded: a layer refuses to be built with limits that could
    /// meet so on such a store. Rates of any partitions always share a
    /// decision.
    pub spans_partitions: bool,
    /// Whether the store answers [`Mode::Reserve`](crate::Mode::Reserve); a layer that waits
    /// refuses to be built on one that does not.
    pub reserves: bool,
    /// How long a concurrency slot outlives its holder if it is never
    /// released (its holder's process died): the holder renews it
    /// ([`Adjustment::Renew`](crate::Adjustment::Renew)) well before. `None`: slots are held until
    /// released.
    pub lease: Option<Duration>,
    /// Whether the store may answer [`Answer::Ready`](crate::Answer::Ready), deciding without
    /// I/O (the memory store; a fallback while its breaker is open). False
    /// for a store that always answers [`Answer::Pending`](crate::Answer::Pending) (a network
    /// store): a caller then does not ask it for a ready answer first,
    /// which would build a pending one only to drop it.
    pub answers_ready: bool,
}

impl Capabilities {
    /// A store labelled `label` that decides rates, within one place
    /// (spanning partitions), without reservations or leases.
    pub const fn new(label: &'static str) -> Self {
        Capabilities {
            label,
            kinds: Self::bit(RuleKind::Rate),
            spans_partitions: true,
            reserves: false,
            lease: None,
            answers_ready: true,
        }
    }

    /// The same, for a store that always answers [`Answer::Pending`](crate::Answer::Pending).
    ///
    /// ```
    /// use rate_tier_storage::Capabilities;
    /// assert!(Capabilities::new("memory").answers_ready);
    /// assert!(!Capabilities::new("redis").always_pending().answers_ready);
    /// ```
    #[must_use]
    pub const fn always_pending(mut self) -> Self {
        self.answers_ready = false;
        self
    }

    /// The same, also deciding `kind`.
    #[must_use]
    pub const fn with(mut self, kind: RuleKind) -> Self {
        self.kinds |= Self::bit(kind);
        self
    }

    /// The same, deciding every kind.
    #[must_use]
    pub const fn with_every_kind(mut self) -> Self {
        let mut i = 0;
        while i < RuleKind::ALL.len() {
            self = self.with(RuleKind::ALL[i]);
            i += 1;
        }
        self
    }

    /// Whether the store decides limits of `kind`; a layer refuses to be
    /// built with a limit its store does not decide.
    pub const fn supports(&self, kind: RuleKind) -> bool {
        self.kinds & Self::bit(kind) != 0
    }

    const fn bit(kind: RuleKind) -> u8 {
        1 << kind as u8
    }
}
