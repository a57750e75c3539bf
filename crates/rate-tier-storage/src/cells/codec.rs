//! The bytes of a cell: one tag byte for the kind, then the kind's state,
//! little-endian, fixed width.
//!
//! | tag | kind | after the tag | length |
//! |---|---|---|---|
//! | 1 | rate | the TAT (`u64` µs) | 9 |
//! | 2 | window | the log, oldest first (`u64` µs each) | 1 + 8n |
//! | 3 | period | the period's start (`u64` µs), its count (`u32`) | 13 |
//! | 4 | concurrency | per holder: its id (`u64`), its slots (`u32`), their expiry (`u64` µs) | 1 + 20n |
//!
//! A value of another kind's tag, of a length its tag does not allow, or
//! empty, is no state of the rule that reads it: the bucket is read as
//! absent (fresh), and the next write replaces it. Values inside a valid
//! frame are left to gcra-core, which reads nonsense as absent too (a TAT
//! or a start past `MAX_TIME_US`, an unsorted log, an expiry past it).

use crate::rule::RuleKind;

const RATE: u8 = 1;
const WINDOW: u8 = 2;
const PERIOD: u8 = 3;
const SLOTS: u8 = 4;
const HOLDER: usize = 20;

/// The slots one request holds in a concurrency limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Holder {
    /// The request's id ([`BucketCheck::lease_id`](crate::BucketCheck::lease_id)); 0 for none.
    pub(super) id: u64,
    /// How many slots it holds.
    pub(super) count: u32,
    /// When they expire (µs); `MAX_TIME_US` when the store has no lease.
    pub(super) expiry_us: u64,
}

/// A cell's state, decoded for the kind of the rule that reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum State {
    Rate(u64),
    Window(Vec<u64>),
    Period { start_us: u64, count: u32 },
    Slots(Vec<Holder>),
}

impl State {
    /// The state of a rule of `kind` held in `bytes`; `None` when the
    /// bytes are no such state.
    pub(super) fn decode(kind: RuleKind, bytes: &[u8]) -> Option<State> {
        let (&tag, body) = bytes.split_first()?;
        match (kind, tag) {
            (RuleKind::Rate, RATE) => {
                Some(State::Rate(u64_at(body, 0)?)).filter(|_| body.len() == 8)
            }
            (RuleKind::Window, WINDOW) if body.len() % 8 == 0 => {
                Some(State::Window(
                    body.chunks_exact(8).filter_map(le_u64).collect(),
                ))
            }
            (RuleKind::Period, PERIOD) if body.len() == 12 => {
                Some(State::Period {
                    start_us: u64_at(body, 0)?,
                    count: u32::from_le_bytes(
                        body.get(8..12)?.try_into().ok()?,
                    ),
                })
            }
            (RuleKind::Concurrency, SLOTS) if body.len() % HOLDER == 0 => body
                .chunks_exact(HOLDER)
                .map(|holder| {
                    Some(Holder {
                        id: u64_at(holder, 0)?,
                        count: u32::from_le_bytes(
                            holder.get(8..12)?.try_into().ok()?,
                        ),
                        expiry_us: u64_at(holder, 12)?,
                    })
                })
                .collect::<Option<Vec<_>>>()
                .map(State::Slots),
            _ => None,
        }
    }

    /// The bytes that hold this state.
    pub(super) fn encode(&self) -> Vec<u8> {
        match self {
            State::Rate(tat) => framed(RATE, 8, |out| put(out, *tat)),
            State::Window(log) => framed(WINDOW, 8 * log.len(), |out| {
                log.iter().for_each(|&entry| put(out, entry));
            }),
            State::Period { start_us, count } => framed(PERIOD, 12, |out| {
                put(out, *start_us);
                out.extend_from_slice(&count.to_le_bytes());
            }),
            State::Slots(holders) => {
                framed(SLOTS, HOLDER * holders.len(), |out| {
                    for holder in holders {
                        put(out, holder.id);
                        out.extend_from_slice(&holder.count.to_le_bytes());
                        put(out, holder.expiry_us);
                    }
                })
            }
        }
    }
}

fn framed(tag: u8, len: usize, body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::with_capacity(len.saturating_add(1));
    out.push(tag);
    body(&mut out);
    out
}

fn put(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn le_u64(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    le_u64(bytes.get(at..at.checked_add(8)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_reads_back_as_written() {
        let states = [
            (RuleKind::Rate, State::Rate(42)),
            (RuleKind::Window, State::Window(vec![1, 2, 3])),
            (RuleKind::Window, State::Window(vec![])),
            (
                RuleKind::Period,
                State::Period {
                    start_us: 7,
                    count: 9,
                },
            ),
            (
                RuleKind::Concurrency,
                State::Slots(vec![Holder {
                    id: 5,
                    count: 2,
                    expiry_us: 11,
                }]),
            ),
        ];
        for (kind, state) in states {
            let bytes = state.encode();
            assert_eq!(State::decode(kind, &bytes), Some(state));
        }
        assert_eq!(State::Rate(1).encode().len(), 9);
        assert_eq!(
            State::Period {
                start_us: 0,
                count: 0
            }
            .encode()
            .len(),
            13
        );
    }

    #[test]
    fn another_kind_a_bad_length_or_nothing_is_no_state() {
        let rate = State::Rate(42).encode();
        assert_eq!(State::decode(RuleKind::Period, &rate), None);
        assert_eq!(State::decode(RuleKind::Rate, &rate[..5]), None);
        assert_eq!(State::decode(RuleKind::Rate, &[]), None);
        assert_eq!(State::decode(RuleKind::Window, &[WINDOW, 1, 2]), None);
        assert_eq!(State::decode(RuleKind::Concurrency, &[SLOTS; 7]), None);
        assert_eq!(State::decode(RuleKind::Rate, &[99; 9]), None);
    }
}
