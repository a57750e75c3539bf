//! [`Leftover`]: what a decision leaves behind once its owner is done
//! (concurrency slots to release, a reservation to cancel, estimates to
//! settle), given back by one path: at once when the store answers without
//! I/O, else in a future of its own, awaited or spawned.
//!
//! A give-back is sent once: a failure is reported, never retried (a slot
//! released twice, or a reservation cancelled after another took its
//! place, would give back what is not this request's).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use rate_tier_storage::key::KeySecret;
use rate_tier_storage::{
    Adjust, BucketCancel, BucketCheck, BucketSettle, Charged, LimitName, Rule,
    Storage, StorageError, StorageExt,
};
use smallvec::SmallVec;

/// A give-back awaited by its caller, or spawned.
pub(crate) type GivingBack = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a decision left, owning what it names.
pub(crate) struct Leftover {
    store: Arc<dyn Storage>,
    secret: Option<Arc<KeySecret>>,
    what: What,
    parts: SmallVec<[Part; 2]>,
}

#[derive(Clone, Copy)]
enum What {
    Release,
    Cancel,
    Settle,
}

/// One bucket's part.
struct Part {
    name: LimitName,
    partition: Box<str>,
    rule: Rule,
    cost: u32,
    /// The request's id, for slots.
    lease: u64,
    /// The TAT a reservation wrote, for a cancel.
    tat_us: u64,
    /// The correction, for a settlement.
    adjust: Adjust,
    charged: Charged,
}

impl Part {
    fn of(check: &BucketCheck<'_>) -> Part {
        Part {
            name: check.limit_name().clone(),
            partition: check.partition().into(),
            rule: check.rule(),
            cost: check.cost(),
            lease: check.lease(),
            tat_us: 0,
            adjust: Adjust::Charge(0),
            charged: Charged::Primary,
        }
    }
}

impl Leftover {
    /// The slots `slots` took, to release.
    pub(crate) fn release<'a, 'b: 'a>(
        store: &Arc<dyn Storage>,
        slots: impl IntoIterator<Item = &'a BucketCheck<'b>>,
    ) -> Leftover {
        let mut parts = SmallVec::new();
        let mut secret = None;
        for check in slots {
            secret = secret.or(check.secret());
            parts.push(Part::of(check));
        }
        Leftover::new(store, secret, What::Release, parts)
    }

    /// The reservations `cancels` made, to give back.
    pub(crate) fn cancel(
        store: &Arc<dyn Storage>,
        cancels: &[BucketCancel<'_>],
    ) -> Leftover {
        let secret = cancels.iter().find_map(|c| c.bucket.secret());
        let parts = cancels
            .iter()
            .map(|cancel| Part {
                tat_us: cancel.tat_us,
                charged: cancel.charged,
                ..Part::of(&cancel.bucket)
            })
            .collect();
        Leftover::new(store, secret, What::Cancel, parts)
    }

    /// The corrections `settles` ask for.
    pub(crate) fn settle(
        store: &Arc<dyn Storage>,
        settles: &[BucketSettle<'_>],
    ) -> Leftover {
        let secret = settles.iter().find_map(|s| s.bucket.secret());
        let parts = settles
            .iter()
            .map(|settle| Part {
                adjust: settle.adjust,
                charged: settle.charged,
                ..Part::of(&settle.bucket)
            })
            .collect();
        Leftover::new(store, secret, What::Settle, parts)
    }

    fn new(
        store: &Arc<dyn Storage>,
        secret: Option<&KeySecret>,
        what: What,
        parts: SmallVec<[Part; 2]>,
    ) -> Leftover {
        Leftover {
            store: Arc::clone(store),
            secret: secret.map(|secret| Arc::new(secret.clone())),
            what,
            parts,
        }
    }

    /// Gives it back: at once when the store answers without I/O (`done`
    /// called, `None`), else as the returned future, which calls `done`.
    pub(crate) fn made(
        self,
        done: impl FnOnce(Result<(), StorageError>) + Send + 'static,
    ) -> Option<GivingBack> {
        if self.parts.is_empty() {
            return None;
        }
        if let Some(result) = self.now() {
            done(result);
            return None;
        }
        Some(Box::pin(async move { done(self.later().await) }))
    }

    /// Gives it back at once, or in a task on the current Tokio runtime;
    /// with none, `done` is told so.
    pub(crate) fn in_background(
        self,
        done: impl FnOnce(Result<(), StorageError>) + Send + 'static,
    ) {
        if self.parts.is_empty() {
            return;
        }
        if let Some(result) = self.now() {
            return done(result);
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move { done(self.later().await) });
            }
            Err(_) => done(Err(StorageError::Backend(
                "no Tokio runtime to give back in".into(),
            ))),
        }
    }

    /// Each part's bucket, beside the part.
    fn checks(&self) -> SmallVec<[(BucketCheck<'_>, &Part); 2]> {
        let secret = self.secret.as_deref();
        self.parts
            .iter()
            .filter_map(|part| {
                let check = BucketCheck::of_rule(
                    &part.name,
                    &part.partition,
                    part.rule,
                    part.cost,
                )
                .ok()?
                .key_secret(secret);
                Some((check, part))
            })
            .collect()
    }

    /// The give-back if the store needs no I/O for it.
    fn now(&self) -> Option<Result<(), StorageError>> {
        let checks = self.checks();
        match self.what {
            What::Release => self.store.release(&slots(&checks)).ready(),
            What::Cancel => self.store.cancel(&cancels(&checks)).ready(),
            What::Settle => self.store.settle(&settles(&checks)).ready(),
        }
    }

    async fn later(&self) -> Result<(), StorageError> {
        let checks = self.checks();
        match self.what {
            What::Release => self.store.release(&slots(&checks)).await,
            What::Cancel => self.store.cancel(&cancels(&checks)).await,
            What::Settle => self.store.settle(&settles(&checks)).await,
        }
    }
}

fn slots<'a>(
    checks: &[(BucketCheck<'a>, &Part)],
) -> SmallVec<[BucketCheck<'a>; 2]> {
    checks
        .iter()
        .map(|(check, part)| check.lease_id(part.lease))
        .collect()
}

fn cancels<'a>(
    checks: &[(BucketCheck<'a>, &Part)],
) -> SmallVec<[BucketCancel<'a>; 2]> {
    checks
        .iter()
        .map(|(check, part)| check.cancel(part.tat_us).charged(part.charged))
        .collect()
}

fn settles<'a>(
    checks: &[(BucketCheck<'a>, &Part)],
) -> SmallVec<[BucketSettle<'a>; 2]> {
    checks
        .iter()
        .map(|(check, part)| check.settle(part.adjust).charged(part.charged))
        .collect()
}
