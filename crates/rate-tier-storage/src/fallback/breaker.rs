//! One circuit breaker: its whole state in one atomic word, so that every
//! transition is a single compare-and-swap.

use crate::sync::{AtomicU32, AtomicU64, Ordering};

use crate::event::BreakerState;

const CLOSED: u8 = 0;
const OPEN: u8 = 1;
const HALF_OPEN: u8 = 2;

const DUE_BITS: u32 = 56;
const DUE_MASK: u64 = (1 << DUE_BITS) - 1;

/// The state (2 bits), how many times the cool-down doubled (6 bits), and
/// when an open breaker is due for a probe (56 bits of µs, beyond any GCRA
/// time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Word {
    state: u8,
    doublings: u8,
    due_us: u64,
}

impl Word {
    const CLOSED: Word = Word {
        state: CLOSED,
        doublings: 0,
        due_us: 0,
    };

    const fn pack(self) -> u64 {
        ((self.state as u64) << 62)
            | (((self.doublings & 0x3f) as u64) << DUE_BITS)
            | (self.due_us & DUE_MASK)
    }

    const fn unpack(word: u64) -> Word {
        Word {
            state: (word >> 62) as u8,
            doublings: ((word >> DUE_BITS) & 0x3f) as u8,
            due_us: word & DUE_MASK,
        }
    }
}

fn state_of(raw: u8) -> BreakerState {
    match raw {
        OPEN => BreakerState::Open,
        HALF_OPEN => BreakerState::HalfOpen,
        _ => BreakerState::Closed,
    }
}

/// The timing a breaker follows.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timing {
    pub(super) failure_threshold: u32,
    pub(super) cool_down_us: u64,
    pub(super) max_cool_down_us: u64,
}

impl Timing {
    /// The cool-down after `doublings` failed probes: doubled each time,
    /// capped.
    fn cool_down_us(&self, doublings: u8) -> u64 {
        self.cool_down_us
            .checked_shl(u32::from(doublings))
            .filter(|cool| *cool >= self.cool_down_us)
            .unwrap_or(u64::MAX)
            .min(self.max_cool_down_us)
    }
}

/// Where a check goes, as the breaker says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
    /// Closed: the primary decides.
    Primary,
    /// This caller won the probe of an open breaker due for one; the
    /// number is the doublings so far.
    Probe(u8),
    /// Open (or another call is probing): decide locally.
    Local,
}

/// A change of state, to report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Transition {
    pub(super) from: BreakerState,
    pub(super) to: BreakerState,
}

#[derive(Debug, Default)]
pub(super) struct Breaker {
    word: AtomicU64,
    failures: AtomicU32,
}

impl Breaker {
    fn load(&self) -> Word {
        Word::unpack(self.word.load(Ordering::Acquire))
    }

    pub(super) fn state(&self) -> BreakerState {
        state_of(self.load().state)
    }

    /// Whether a check may skip the primary at once: open and not yet due,
    /// or half-open. (A due breaker is for [`Breaker::route`] to decide.)
    pub(super) fn is_local(&self, now_us: u64) -> bool {
        let word = self.load();
        match word.state {
            OPEN => now_us < word.due_us,
            HALF_OPEN => true,
            _ => false,
        }
    }

    /// Routes one check; on an open breaker due for a probe, the first
    /// caller wins the probe (OPEN -> HALF_OPEN) and the others go local.
    pub(super) fn route(&self, now_us: u64) -> (Route, Option<Transition>) {
        let raw = self.word.load(Ordering::Acquire);
        let word = Word::unpack(raw);
        match word.state {
            CLOSED => (Route::Primary, None),
            OPEN if now_us >= word.due_us => {
                let probing = Word {
                    state: HALF_OPEN,
                    ..word
                };
                let won = self
                    .word
                    .compare_exchange(
                        raw,
                        probing.pack(),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    )
                    .is_ok();
                if won {
                    let opened = Transition {
                        from: BreakerState::Open,
                        to: BreakerState::HalfOpen,
                    };
                    (Route::Probe(word.doublings), Some(opened))
                } else {
                    (Route::Local, None)
                }
            }
            _ => (Route::Local, None),
        }
    }

    /// The primary answered a closed breaker.
    pub(super) fn succeeded(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }

    /// The primary failed a closed breaker: opens it at the threshold.
    pub(super) fn failed(
        &self,
        timing: &Timing,
        now_us: u64,
    ) -> Option<Transition> {
        let failures = self
            .failures
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        if failures < timing.failure_threshold {
            return None;
        }
        // State and deadline change together: no check can see it open
        // with a stale deadline.
        let open = opened(timing, now_us, 0);
        self.word
            .compare_exchange(
                Word::CLOSED.pack(),
                open.pack(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .ok()
            .map(|_| Transition {
                from: BreakerState::Closed,
                to: BreakerState::Open,
            })
    }

    /// The probe reached the primary and it answered: closed.
    pub(super) fn close(&self) -> Transition {
        self.failures.store(0, Ordering::Relaxed);
        self.word.store(Word::CLOSED.pack(), Ordering::Release);
        Transition {
            from: BreakerState::HalfOpen,
            to: BreakerState::Closed,
        }
    }

    /// The probe failed: open again, for twice as long (up to the cap).
    pub(super) fn reopen(
        &self,
        timing: &Timing,
        now_us: u64,
        doublings: u8,
    ) -> Transition {
        let doublings = doublings.saturating_add(1).min(0x3f);
        self.word
            .store(opened(timing, now_us, doublings).pack(), Ordering::Release);
        Transition {
            from: BreakerState::HalfOpen,
            to: BreakerState::Open,
        }
    }

    /// The probe never reached the primary (its inputs were refused
    /// first): nothing was learned, so back to open, due at once, for the
    /// next check to probe.
    pub(super) fn unprobed(&self, now_us: u64, doublings: u8) -> Transition {
        let open = Word {
            state: OPEN,
            doublings,
            due_us: now_us.min(DUE_MASK),
        };
        self.word.store(open.pack(), Ordering::Release);
        Transition {
            from: BreakerState::HalfOpen,
            to: BreakerState::Open,
        }
    }
}

/// An open breaker with this many doublings, due after its cool-down.
fn opened(timing: &Timing, now_us: u64, doublings: u8) -> Word {
    Word {
        state: OPEN,
        doublings,
        due_us: now_us
            .saturating_add(timing.cool_down_us(doublings))
            .min(DUE_MASK),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_word_round_trips() {
        for word in [
            Word::CLOSED,
            Word {
                state: OPEN,
                doublings: 5,
                due_us: 1_790_947_155_000_000,
            },
            Word {
                state: HALF_OPEN,
                doublings: 0x3f,
                due_us: DUE_MASK,
            },
        ] {
            assert_eq!(Word::unpack(word.pack()), word);
        }
    }

    #[test]
    fn an_open_breaker_routes_locally_until_due_then_to_a_single_probe() {
        let timing = Timing {
            failure_threshold: 1,
            cool_down_us: 1_000,
            max_cool_down_us: 8_000,
        };
        let breaker = Breaker::default();
        assert!(breaker.failed(&timing, 0).is_some());
        // A caller that found it closed may route it once it opened: local
        // until the cool-down is over, whatever it saw before.
        assert_eq!(breaker.route(999), (Route::Local, None));
        assert_eq!(breaker.state(), BreakerState::Open);
        let (route, transition) = breaker.route(1_000);
        assert_eq!(route, Route::Probe(0));
        assert!(transition.is_some());
        assert_eq!(breaker.route(1_000).0, Route::Local, "one probe at a time");
    }
}

/// The breaker's one-word state under the model checker (`cargo xtask
/// loom`): every interleaving of two or three threads.
#[cfg(all(test, trt_loom))]
mod loom_model {
    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    const TIMING: Timing = Timing {
        failure_threshold: 2,
        cool_down_us: 1_000,
        max_cool_down_us: 8_000,
    };

    /// Every interleaving, up to 4 preemptions.
    fn model(test: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(4);
        builder.check(test);
    }

    /// An open breaker due for a probe at 1 000 µs.
    fn due() -> Arc<Breaker> {
        let breaker = Arc::new(Breaker::default());
        breaker.failed(&TIMING, 0);
        breaker.failed(&TIMING, 0);
        assert_eq!(breaker.state(), BreakerState::Open);
        breaker
    }

    #[test]
    fn one_probe_at_a_time() {
        model(|| {
            let breaker = due();
            let other = {
                let breaker = breaker.clone();
                thread::spawn(move || breaker.route(1_000).0)
            };
            let mine = breaker.route(1_000).0;
            let theirs = other.join().unwrap();
            let probes = [mine, theirs]
                .iter()
                .filter(|r| matches!(r, Route::Probe(_)))
                .count();
            assert_eq!(probes, 1, "{mine:?} {theirs:?}");
            assert_eq!(breaker.state(), BreakerState::HalfOpen);
        });
    }

    #[test]
    fn the_threshold_opens_it_once() {
        model(|| {
            let breaker = Arc::new(Breaker::default());
            let other = {
                let breaker = breaker.clone();
                thread::spawn(move || breaker.failed(&TIMING, 0))
            };
            let mine = breaker.failed(&TIMING, 0);
            let theirs = other.join().unwrap();
            let opened = [mine, theirs].iter().filter(|t| t.is_some()).count();
            assert_eq!(opened, 1, "{mine:?} {theirs:?}");
            assert_eq!(breaker.state(), BreakerState::Open);
        });
    }

    #[test]
    fn a_closing_probe_and_checks_beside_it() {
        model(|| {
            let breaker = due();
            let (Route::Probe(_), _) = breaker.route(1_000) else {
                panic!("the probe")
            };
            let checks: Vec<_> = (0..2)
                .map(|_| {
                    let breaker = breaker.clone();
                    thread::spawn(move || breaker.route(1_000).0)
                })
                .collect();
            breaker.close();
            for check in checks {
                let route = check.join().unwrap();
                // Half-open: local; closed: the primary. Never a second
                // probe while the first is out.
                assert!(
                    matches!(route, Route::Local | Route::Primary),
                    "{route:?}"
                );
            }
            assert_eq!(breaker.state(), BreakerState::Closed);
        });
    }
}
