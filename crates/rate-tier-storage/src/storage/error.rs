//! [`StorageError`]: why a store gave no decision.

use std::sync::Arc;
use std::time::Duration;

use gcra_core::CheckError;

/// Why a store gave no decision.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The store did not answer in time.
    #[error("storage did not answer within {0:?}")]
    Timeout(Duration),
    /// The backend failed (connection refused, I/O error, script error).
    #[error("storage backend failed: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The backend answered something this crate cannot read.
    #[error("unexpected reply from storage: {0}")]
    Protocol(String),
    /// The GCRA math refused the inputs.
    #[error(transparent)]
    Check(#[from] CheckError),
    /// The same bucket appeared twice in one decision.
    #[error("the same bucket appears twice in one decision: merge its costs")]
    DuplicateBucket,
    /// `out` is not as long as the checks.
    #[error("{checks} checks but room for {out} decisions")]
    LengthMismatch {
        /// How many checks.
        checks: usize,
        /// How many decisions fit in `out`.
        out: usize,
    },
    /// During an outage a fallback decides with each quota divided among
    /// the instances, and this cost is above the divided burst: it could
    /// pass once the primary is back (a transient refusal, never a
    /// permanent one).
    #[error(
        "cost {cost} is above the burst of {burst} this instance applies while the primary store is down"
    )]
    AboveLocalShare {
        /// The cost asked for.
        cost: u32,
        /// The burst applied locally.
        burst: u32,
    },
    /// The store does not do this.
    #[error("this store does not support {0}")]
    Unsupported(&'static str),
    /// Every attempt of a decision lost its compare-and-swap to other
    /// writers of the same buckets (a [`CellStorage`](crate::cells::CellStorage)
    /// under heavy contention): nothing was charged. Not a failure of the
    /// store, which answered every call: a breaker does not count it.
    #[error("{attempts} attempts in a row lost their compare-and-swap")]
    Contended {
        /// How many attempts were made.
        attempts: u32,
    },
    /// A store made of parts that fail independently (the nodes of a Redis
    /// Cluster, see [`Storage::failure_domain`](crate::Storage::failure_domain)) failed in one of them: a
    /// fallback counts the failure against that part alone.
    #[error("{domain}: {error}")]
    InDomain {
        /// The part that failed, as [`Storage::failure_domain`](crate::Storage::failure_domain) names it.
        domain: Arc<str>,
        /// Its failure.
        #[source]
        error: Box<StorageError>,
    },
}

impl StorageError {
    /// Whether the error says the store is unhealthy (down, slow, or
    /// answering nonsense), as opposed to a refusal of the inputs: what a
    /// circuit breaker counts.
    ///
    /// ```
    /// use std::time::Duration;
    /// use rate_tier_storage::StorageError;
    /// assert!(StorageError::Timeout(Duration::from_millis(100)).is_failure());
    /// assert!(!StorageError::DuplicateBucket.is_failure());
    /// ```
    pub fn is_failure(&self) -> bool {
        match self {
            StorageError::Timeout(_)
            | StorageError::Backend(_)
            | StorageError::Protocol(_) => true,
            StorageError::InDomain { error, .. } => error.is_failure(),
            _ => false,
        }
    }

    /// The part of the store that failed, when the store names one.
    ///
    /// ```
    /// use std::time::Duration;
    /// use rate_tier_storage::StorageError;
    /// let failed = StorageError::InDomain {
    ///     domain: "10.0.0.2:7000".into(),
    ///     error: Box::new(StorageError::Timeout(Duration::from_millis(100))),
    /// };
    /// assert_eq!(failed.domain(), Some("10.0.0.2:7000"));
    /// assert!(failed.is_failure());
    /// ```
    pub fn domain(&self) -> Option<&str> {
        match self {
            StorageError::InDomain { domain, .. } => Some(domain),
            _ => None,
        }
    }
}
