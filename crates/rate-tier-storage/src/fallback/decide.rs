//! Where each bucket of a decision is decided: the primary, the local
//! store, or both in one decision.
//!
//! Each bucket belongs to a failure domain (one for a single Redis, a node
//! for a Redis Cluster) and each domain has a breaker. A decision whose
//! buckets all have an open breaker is local; one whose breakers are all
//! closed (or due for a probe) goes to the primary. A decision over both
//! (the tier of a user on a healthy node and a global limit on the node that
//! is down) is **mixed**: the local part is decided first, in memory; if it
//! refuses, the primary's part is only read; if it passes, the primary
//! decides its part, and a refusal there gives the local charges back. All
//! or nothing, as every decision, and only the buckets of the failed node
//! leave the shared store.
//!
//! A failure the primary names ([`StorageError::InDomain`]) counts against
//! that domain's breaker alone.

use std::sync::Arc;

use gcra_core::{Adjust, Decision, Verdict};
use smallvec::SmallVec;

use super::breaker::{Breaker, Route};
use super::{Inner, LOCAL, ProbeGuard};
use crate::bucket::BucketCheck;
use crate::event::StorageEvent;
use crate::rule::Rule;
use crate::storage::{Decided, StorageError, StorageExt};

/// The breakers a decision passes through, each with its domain.
pub(super) type Breakers = SmallVec<[(Option<Arc<str>>, Arc<Breaker>); 2]>;

/// The breakers of `checks`, and the position of each check's among them.
pub(super) struct Routing {
    pub(super) breakers: Breakers,
    pub(super) of_check: SmallVec<[usize; 4]>,
}

/// What the primary made of its part of a decision.
pub(super) enum Primary {
    /// It decided.
    Decided(Decided),
    /// It failed (counted against its breakers): decide locally instead.
    Failed,
}

impl Inner {
    pub(super) fn routing(&self, checks: &[BucketCheck<'_>]) -> Routing {
        let mut breakers = Breakers::new();
        let mut of_check = SmallVec::with_capacity(checks.len());
        for check in checks {
            let domain = self.primary.failure_domain(check);
            let at = match breakers.iter().position(|(d, _)| *d == domain) {
                Some(at) => at,
                None => {
                    let breaker = match &domain {
                        None => self.whole.clone(),
                        Some(name) => self.domain_breaker(name),
                    };
                    breakers.push((domain, breaker));
                    breakers.len() - 1
                }
            };
            of_check.push(at);
        }
        Routing { breakers, of_check }
    }

    /// `checks` under the local share of their quotas.
    pub(super) fn local_checks<'c>(
        &self,
        checks: impl IntoIterator<Item = BucketCheck<'c>>,
    ) -> Result<SmallVec<[BucketCheck<'c>; 4]>, StorageError> {
        let share = self.local_share;
        checks
            .into_iter()
            .map(|check| {
                let rule = check.rule().divided(share);
                if check.cost() > rule.limit() {
                    return Err(StorageError::AboveLocalShare {
                        cost: check.cost(),
                        burst: rule.limit(),
                    });
                }
                Ok(check.with_rule(rule))
            })
            .collect()
    }

    pub(super) fn decide_locally(
        &self,
        checks: &[BucketCheck<'_>],
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        Self::slots_have_ids(checks)?;
        let local = self.local_checks(checks.iter().copied())?;
        let decided = self.local.check_sync(&local, out)?;
        if decided.verdict.allowed {
            self.took_locally(&local, out);
        }
        self.listeners.emit_with(|| StorageEvent::Fallback {
            limit: checks.first().map_or("", |c| c.name()).to_owned(),
            allowed: decided.verdict.allowed,
        });
        Ok(locally(decided, self.local_share))
    }

    pub(super) async fn decide(
        &self,
        checks: &[BucketCheck<'_>],
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        let Routing { breakers, of_check } = self.routing(checks);
        let routes = self.routes(&breakers);
        let local: SmallVec<[bool; 4]> = of_check
            .iter()
            .map(|&b| matches!(routes[b], Route::Local))
            .collect();
        if local.iter().all(|&l| l) {
            return self.decide_locally(checks, out);
        }
        if !local.iter().any(|&l| l) {
            let call = self.primary.check(checks, out);
            return match self.on_primary(call, &breakers, &routes).await? {
                Primary::Decided(decided) => Ok(decided),
                Primary::Failed => self.decide_locally(checks, out),
            };
        }
        self.decide_mixed(checks, out, &local, &of_check, &breakers, &routes)
            .await
    }

    /// Each breaker's route: local (open, or another call probes it), the
    /// primary, or the primary as this call's probe.
    pub(super) fn routes(&self, breakers: &Breakers) -> SmallVec<[Route; 2]> {
        let now = self.clock.now_us();
        let mut routes: SmallVec<[Route; 2]> = SmallVec::new();
        for (domain, breaker) in breakers {
            if breaker.is_local(now) {
                routes.push(Route::Local);
                continue;
            }
            let (route, transition) = breaker.route(now);
            if let Some(transition) = transition {
                self.report(domain, transition, None);
            }
            routes.push(route);
        }
        routes
    }

    /// `call` (a decision on the primary), through `breakers` (their
    /// `routes` are the primary or a probe): the breakers learn from the
    /// answer.
    pub(super) async fn on_primary(
        &self,
        call: impl Future<Output = Result<Decided, StorageError>>,
        breakers: &Breakers,
        routes: &[Route],
    ) -> Result<Primary, StorageError> {
        let probes: SmallVec<[(usize, u8); 2]> = routes
            .iter()
            .enumerate()
            .filter_map(|(i, route)| match route {
                Route::Probe(doublings) => Some((i, *doublings)),
                _ => None,
            })
            .collect();
        // Dropped mid-call (the caller gave up): a probe in flight counts
        // as a failed one, rather than stay half-open with no probe.
        let guard = ProbeGuard {
            inner: self,
            breakers,
            probes: &probes,
        };
        let result = call.await;
        std::mem::forget(guard);

        let now = self.clock.now_us();
        let probing =
            |i: usize| probes.iter().find(|(p, _)| *p == i).map(|(_, d)| *d);
        let unprobed = || {
            for &(i, doublings) in &probes {
                let (domain, breaker) = &breakers[i];
                self.report(domain, breaker.unprobed(now, doublings), None);
            }
        };
        match result {
            Ok(decided) if !decided.reached_backend => {
                // Answered from the primary's memory: nothing learned.
                unprobed();
                Ok(Primary::Decided(decided))
            }
            Ok(decided) => {
                for (i, (domain, breaker)) in breakers.iter().enumerate() {
                    match probing(i) {
                        Some(_) => self.report(domain, breaker.close(), None),
                        None => breaker.succeeded(),
                    }
                }
                self.replay_pending();
                Ok(Primary::Decided(decided))
            }
            Err(error) if error.is_failure() => {
                for (i, (domain, breaker)) in breakers.iter().enumerate() {
                    // A failure the primary places in one part is that
                    // part's alone: the others neither failed nor answered.
                    let elsewhere = error.domain().is_some_and(|failed| {
                        domain.as_deref() != Some(failed)
                    });
                    let transition = match (probing(i), elsewhere) {
                        (Some(d), true) => Some(breaker.unprobed(now, d)),
                        (None, true) => None,
                        (Some(d), false) => {
                            Some(breaker.reopen(&self.timing, now, d))
                        }
                        (None, false) => breaker.failed(&self.timing, now),
                    };
                    if let Some(transition) = transition {
                        self.report(domain, transition, Some(&error));
                    }
                }
                Ok(Primary::Failed)
            }
            Err(error) => {
                // Refused before reaching the primary: nothing learned.
                unprobed();
                Err(error)
            }
        }
    }

    /// A decision whose buckets are partly local (`local[i]`), partly on
    /// the primary: see the [module docs](self).
    #[allow(clippy::too_many_arguments)]
    async fn decide_mixed(
        &self,
        checks: &[BucketCheck<'_>],
        out: &mut [Decision],
        local: &[bool],
        of_check: &[usize],
        breakers: &Breakers,
        routes: &[Route],
    ) -> Result<Decided, StorageError> {
        let here: SmallVec<[usize; 4]> =
            (0..checks.len()).filter(|&i| local[i]).collect();
        let there: SmallVec<[usize; 4]> =
            (0..checks.len()).filter(|&i| !local[i]).collect();
        // The breakers of the primary's part, and their routes.
        let mut remote_breakers = Breakers::new();
        let mut remote_routes: SmallVec<[Route; 2]> = SmallVec::new();
        for &i in &there {
            let b = of_check[i];
            if !remote_breakers.iter().any(|(d, _)| *d == breakers[b].0) {
                remote_breakers.push(breakers[b].clone());
                remote_routes.push(routes[b]);
            }
        }

        let local_checks =
            self.local_checks(here.iter().map(|&i| checks[i]))?;
        Self::slots_have_ids(&local_checks)?;
        let mut local_out: SmallVec<[Decision; 4]> =
            SmallVec::from_elem(Decision::default(), here.len());
        let decided_here =
            self.local.check_sync(&local_checks, &mut local_out)?;
        self.listeners.emit_with(|| StorageEvent::Fallback {
            limit: local_checks.first().map_or("", |c| c.name()).to_owned(),
            allowed: decided_here.verdict.allowed,
        });
        let remote_checks: SmallVec<[BucketCheck<'_>; 4]> =
            there.iter().map(|&i| checks[i]).collect();
        let mut remote_out: SmallVec<[Decision; 4]> =
            SmallVec::from_elem(Decision::default(), there.len());
        let mut everything_local = false;

        if !decided_here.verdict.allowed {
            // Refused here: the primary's part is only read, to report it;
            // unread, it says it would pass, its state unknown.
            let peeks: SmallVec<[BucketCheck<'_>; 4]> =
                remote_checks.iter().map(|c| c.as_peek()).collect();
            if self.primary.check(&peeks, &mut remote_out).await.is_err() {
                remote_out.fill(Decision {
                    allowed: true,
                    ..Decision::default()
                });
            }
            for (slot, check) in remote_out.iter_mut().zip(&remote_checks) {
                *slot = check.would_meet(slot);
            }
            let now = self.clock.now_us();
            for (domain, route) in remote_breakers.iter().zip(&remote_routes) {
                if let Route::Probe(doublings) = route {
                    self.report(
                        &domain.0,
                        domain.1.unprobed(now, *doublings),
                        None,
                    );
                }
            }
        } else {
            let call = self.primary.check(&remote_checks, &mut remote_out);
            match self
                .on_primary(call, &remote_breakers, &remote_routes)
                .await
            {
                Ok(Primary::Decided(decided)) => {
                    if !decided.verdict.allowed {
                        self.give_back(&local_checks, &mut local_out);
                    }
                }
                Ok(Primary::Failed) => {
                    // The primary failed: its part is decided here too.
                    everything_local = true;
                    let decided =
                        self.decide_locally(&remote_checks, &mut remote_out)?;
                    if !decided.verdict.allowed {
                        self.give_back(&local_checks, &mut local_out);
                    }
                }
                Err(error) => {
                    self.give_back(&local_checks, &mut local_out);
                    return Err(error);
                }
            }
        }

        let mut mask = 0u64;
        for (&i, decision) in here.iter().zip(&local_out) {
            out[i] = *decision;
            mask |= u32::try_from(i)
                .map_or(0, |i| 1u64.checked_shl(i).unwrap_or(0));
        }
        for (&i, decision) in there.iter().zip(&remote_out) {
            out[i] = *decision;
        }
        let verdict =
            Verdict::of(checks.iter().map(BucketCheck::is_shadow), out);
        if verdict.allowed {
            self.took_locally(&local_checks, &local_out);
        }
        let mut decided = Decided::new(verdict, None, LOCAL);
        decided.share = self.local_share;
        decided.local = if everything_local || checks.len() > 64 {
            u64::MAX
        } else {
            mask
        };
        Ok(decided)
    }

    /// Gives back, in the local store, what `checks` charged there (the
    /// primary refused the rest of the decision), and says so in `out`.
    fn give_back(&self, checks: &[BucketCheck<'_>], out: &mut [Decision]) {
        for (check, decision) in checks.iter().zip(out.iter_mut()) {
            if check.cost() == 0 || !decision.allowed {
                continue;
            }
            if let Rule::Concurrency(concurrency) = check.rule() {
                // The slots taken go back: the request is not served.
                if self.local.release_sync(&[*check]).is_ok() {
                    decision.remaining = decision
                        .remaining
                        .saturating_add(u64::from(check.cost()))
                        .min(u64::from(concurrency.limit()));
                }
                continue;
            }
            // A window's or a period's charge has no refund: it stays (the
            // user waits a little longer, never gets more).
            if !check.is_rate() {
                continue;
            }
            let refund = check.settle(Adjust::Refund(check.cost()));
            if self.local.settle_sync(&[refund]).is_ok() {
                let quota = check.quota();
                let cost = u64::from(check.cost());
                decision.remaining = decision
                    .remaining
                    .saturating_add(cost)
                    .min(u64::from(quota.burst()));
                decision.reset_after_us =
                    decision.reset_after_us.saturating_sub(
                        quota.emission_interval_us().saturating_mul(cost),
                    );
            }
        }
    }
}

/// `decided`, every bucket decided locally under quotas divided by `share`.
pub(super) fn locally(mut decided: Decided, share: u32) -> Decided {
    decided.by = LOCAL;
    decided.share = share;
    decided.local = u64::MAX;
    decided
}
