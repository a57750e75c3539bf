//! Calendar periods in the rates' table: one packed `AtomicU64` word per
//! bucket, decided by compare-and-swap like a rate's TAT, and locked by a
//! joint decision's lock bit like one.
//!
//! # The word
//!
//! | bits  | what                                                       |
//! |-------|------------------------------------------------------------|
//! | 0–31  | the count                                                  |
//! | 32–48 | the period's first local day, days since 1970-01-01, + 32  |
//! | 49–51 | its length: 1, 7, 28, 29, 30 or 31 days (codes 0 to 5)     |
//! | 52–59 | the offset from UTC, in whole 15 minutes, rounded down, + 72 |
//! | 62    | [`PERIOD`]: set in every period word                       |
//! | 63    | [`super::table::LOCKED`]: held by a joint decision         |
//!
//! A rate's TAT is below 2^53 (gcra-core's `MAX_TIME_US`), so bit 62 tells
//! the kinds apart, and gcra-core reads a period word met by a rate (a
//! reload that changed the bucket's kind, a name collision) as a corrupted
//! TAT, that is as absent. A period meets a rate's TAT as absent too.
//!
//! The day: every instant until `MAX_TIME_US` is before day 104 250, and a
//! period that began before the epoch began at most 31 days before it (a
//! December 1969, local), so day + 32 fits 17 bits.
//!
//! While the period holds `now`, its bounds come from the word without the
//! calendar: the start is the first day's local midnight (`day × 1 day −
//! offset`, 0 for the period that holds the epoch, as gcra-core clamps it)
//! and the next start is `(day + length) × 1 day − offset`, with the
//! offset of the check's rule (exact to the second). Only a new period
//! goes through the calendar (`Period::check`).
//!
//! The offset kept in the word serves the sweeper and evictions, which
//! read a word without its rule: a period's word is dead once the next
//! period starts, and that instant, computed with the offset rounded down
//! to 15 minutes, is never before the real one (and exact for every real
//! time zone, whose offsets are whole quarter hours). An offset in seconds
//! does not fit: a `Period` may have any offset within ±18 h.

use gcra_core::{CheckError, Period, PeriodDecision, PeriodUnit, Verdict};

use super::table::{LOCKED, NO_TAT};
use super::{Inner, Shard, read};
use crate::bucket::BucketCheck;
use crate::storage::StorageError;
use crate::sync::{self, Ordering, spin};
use gcra_core::Decision;

/// Set in every period word (a rate's TAT is below 2^53).
pub(super) const PERIOD: u64 = 1 << 62;

const DAY_US: i64 = 86_400_000_000;
const QUARTER_HOUR_S: i32 = 900;
/// Added to the first day so that a period from before the epoch is
/// positive.
const DAY_BIAS: i64 = 32;
const DAY_SHIFT: u32 = 32;
const DAY_BITS: u32 = 17;
const LENGTH_SHIFT: u32 = 49;
const OFFSET_SHIFT: u32 = 52;
/// Offsets from −18 h to +18 h: −72 to +72 quarter hours.
const OFFSET_BIAS: i32 = 72;
/// The period lengths, by code.
const LENGTHS: [u8; 6] = [1, 7, 28, 29, 30, 31];

/// A period word, unpacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PeriodWord {
    /// The first local day, days since 1970-01-01 (negative before).
    pub(super) first_day: i32,
    /// Days in the period: one of [`LENGTHS`].
    pub(super) days: u8,
    /// The offset from UTC in quarter hours, rounded down: −72 to 72.
    pub(super) quarters: i8,
    pub(super) count: u32,
}

impl PeriodWord {
    /// The word of a period; `None` when a field is out of its range
    /// (never for a period gcra-core placed).
    pub(super) fn pack(self) -> Option<u64> {
        let day = u64::try_from(i64::from(self.first_day) + DAY_BIAS).ok()?;
        if day >> DAY_BITS != 0 {
            return None;
        }
        let length = LENGTHS.iter().position(|&d| d == self.days)? as u64;
        let quarters =
            u64::try_from(i32::from(self.quarters) + OFFSET_BIAS).ok()?;
        if quarters > 2 * OFFSET_BIAS as u64 {
            return None;
        }
        Some(
            PERIOD
                | quarters << OFFSET_SHIFT
                | length << LENGTH_SHIFT
                | day << DAY_SHIFT
                | u64::from(self.count),
        )
    }

    /// A period's word unpacked, the lock bit ignored; `None` for anything
    /// else (a rate's TAT, nothing, a code out of range).
    #[inline]
    pub(super) fn unpack(word: u64) -> Option<PeriodWord> {
        if word & PERIOD == 0 {
            return None;
        }
        let days = *LENGTHS.get(((word >> LENGTH_SHIFT) & 0b111) as usize)?;
        let quarters = ((word >> OFFSET_SHIFT) & 0xff) as i32 - OFFSET_BIAS;
        if quarters.abs() > OFFSET_BIAS {
            return None;
        }
        let day = ((word >> DAY_SHIFT) & ((1 << DAY_BITS) - 1)) as i64;
        Some(PeriodWord {
            // Below 2^17: every conversion is lossless.
            first_day: (day - DAY_BIAS) as i32,
            days,
            quarters: quarters as i8,
            count: word as u32,
        })
    }

    /// The same period with another count.
    #[inline]
    fn with_count(word: u64, count: u32) -> u64 {
        (word & !(LOCKED | u64::from(u32::MAX))) | u64::from(count)
    }

    /// `(start, next)` of this period at `offset_s` (µs since the epoch):
    /// the start 0 for the period that holds the epoch, as gcra-core says.
    #[inline]
    pub(super) fn bounds(&self, offset_s: i32) -> (u64, u64) {
        let offset_us = i64::from(offset_s) * 1_000_000;
        let first = i64::from(self.first_day);
        // |day| < 2^17 days: far within i64.
        let start = first * DAY_US - offset_us;
        let next = (first + i64::from(self.days)) * DAY_US - offset_us;
        (
            u64::try_from(start).unwrap_or(0),
            u64::try_from(next).unwrap_or(0),
        )
    }

    /// When the word is dead: the next period's start, at the offset the
    /// word keeps (never before the real one).
    pub(super) fn expiry(&self) -> u64 {
        self.bounds(i32::from(self.quarters) * QUARTER_HOUR_S).1
    }

    /// Whether this word's length is one `unit` has.
    #[inline]
    fn fits(&self, unit: PeriodUnit) -> bool {
        match unit {
            PeriodUnit::Day => self.days == 1,
            PeriodUnit::Week => self.days == 7,
            PeriodUnit::Month => self.days >= 28,
        }
    }

    /// The word of the period `period` counts at `now` with `count`, from
    /// its decision (`start_us` its write's start, `next_us` = `now +
    /// reset_after`): no calendar needed.
    fn of_decision(
        period: &Period,
        start_us: u64,
        next_us: u64,
        count: u32,
    ) -> Option<u64> {
        let offset_us = i64::from(period.offset_s()) * 1_000_000;
        // next is a local midnight: (next + offset) is a whole day.
        let next_day = (i64::try_from(next_us).ok()? + offset_us) / DAY_US;
        let days: i64 = match period.unit() {
            PeriodUnit::Day => 1,
            PeriodUnit::Week => 7,
            // A start clamped to 0 (the period began before the epoch, or
            // at an offset ahead of UTC on 1970-01-01) is December 1969 or
            // January 1970, local: 31 days either way.
            PeriodUnit::Month if start_us == 0 && offset_us != 0 => 31,
            PeriodUnit::Month => {
                next_day - (i64::try_from(start_us).ok()? + offset_us) / DAY_US
            }
        };
        PeriodWord {
            first_day: i32::try_from(next_day - days).ok()?,
            days: u8::try_from(days).ok()?,
            quarters: i8::try_from(
                period.offset_s().div_euclid(QUARTER_HOUR_S),
            )
            .ok()?,
            count,
        }
        .pack()
    }
}

/// A period's decision on the word its bucket holds (`word` without the
/// lock bit; anything but a period's word reads as absent), and the word
/// to write if it stands.
#[inline]
pub(super) fn decide(
    period: &Period,
    word: u64,
    now: u64,
    cost: u32,
) -> Result<(PeriodDecision, Option<u64>), CheckError> {
    if let Some(kept) = PeriodWord::unpack(word) {
        let (start, next) = kept.bounds(period.offset_s());
        // A word of another unit (a reload changed it) is placed by the
        // calendar, as a stored start is.
        if kept.fits(period.unit()) && start <= now && now < next {
            // The same period: no calendar.
            let decided =
                period.check_within(start, next, kept.count, now, cost)?;
            let write =
                decided.write.map(|w| PeriodWord::with_count(word, w.count));
            return Ok((decided, write));
        }
        let decided = period.check(Some((start, kept.count)), now, cost)?;
        return Ok((decided, new_word(period, &decided, now)?));
    }
    let decided = period.check(None, now, cost)?;
    Ok((decided, new_word(period, &decided, now)?))
}

/// The word of a decision that counts in a period its bucket did not hold.
#[cold]
fn new_word(
    period: &Period,
    decided: &PeriodDecision,
    now: u64,
) -> Result<Option<u64>, CheckError> {
    let Some(write) = decided.write else {
        return Ok(None);
    };
    let next = now.saturating_add(decided.reset_after_us);
    PeriodWord::of_decision(period, write.start_us, next, write.count)
        .map(Some)
        .ok_or(CheckError::TimeOutOfRange)
}

/// The instant a table word is dead at: a rate's TAT, or a period's next
/// start.
#[inline]
pub(super) fn expiry(word: u64) -> u64 {
    let word = word & !LOCKED;
    if word & PERIOD == 0 {
        return word;
    }
    // A word no period wrote is dead.
    PeriodWord::unpack(word).map_or(0, |kept| kept.expiry())
}

/// One compare-and-swap loop on a period's word: the decision is applied
/// only if the word it was made from is still the stored one.
#[inline(always)]
pub(super) fn decide_in_place(
    cell: &sync::AtomicU64,
    period: &Period,
    check: &BucketCheck<'_>,
    now: u64,
    out: &mut Decision,
) -> Result<Verdict, StorageError> {
    let cost = check.cost();
    let mut current = cell.load(Ordering::Acquire);
    loop {
        if current & LOCKED != 0 {
            // A joint decision holds the bucket for a few instructions.
            spin(0);
            current = cell.load(Ordering::Acquire);
            continue;
        }
        let (decided, write) = decide(period, current, now, cost)?;
        *out = decided.as_decision();
        let Some(write) = write else {
            break;
        };
        match cell.compare_exchange_weak(
            current,
            write,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => break,
            Err(actual) => current = actual,
        }
    }
    Ok(Verdict::of([check.is_shadow()], std::slice::from_ref(out)))
}

impl Inner {
    /// One period alone: as a rate alone, one lookup under the shard's read
    /// lock and one compare-and-swap loop.
    #[inline(always)]
    pub(super) fn decide_period_one(
        &self,
        period: &Period,
        check: &BucketCheck<'_>,
        now: u64,
        out: &mut Decision,
    ) -> Result<Verdict, StorageError> {
        let (name, shard) = self.name(check);
        let shard = &self.shards[shard];
        let table = read(&shard.table);
        match table.find(name) {
            Some(entry) => decide_in_place(&entry.tat, period, check, now, out),
            None => {
                drop(table);
                self.decide_period_new(period, check, name, shard, now, out)
            }
        }
    }

    /// A period the table does not hold yet: decided as a fresh one before
    /// any write lock, so that a refusal or a peek stores nothing.
    #[cold]
    fn decide_period_new(
        &self,
        period: &Period,
        check: &BucketCheck<'_>,
        name: u64,
        shard: &Shard,
        now: u64,
        out: &mut Decision,
    ) -> Result<Verdict, StorageError> {
        let (decided, write) = decide(period, NO_TAT, now, check.cost())?;
        *out = decided.as_decision();
        let verdict =
            Verdict::of([check.is_shadow()], std::slice::from_ref(out));
        let Some(write) = write else {
            return Ok(verdict);
        };
        let mut room = self.room_for(shard, name, now, &[])?;
        // Another thread may have made it in between.
        let verdict = match room.table.find(name) {
            Some(entry) => {
                decide_in_place(&entry.tat, period, check, now, out)?
            }
            None => {
                room.table.insert(name, write);
                verdict
            }
        };
        self.made(room);
        Ok(verdict)
    }
}

#[cfg(test)]
mod tests {
    use gcra_core::{MAX_OFFSET_S, MAX_TIME_US, Period, PeriodUnit};
    use proptest::prelude::*;

    use super::{LENGTHS, LOCKED, PERIOD, PeriodWord, decide, expiry};

    const DAY: u64 = 86_400_000_000;
    /// The last day an instant up to `MAX_TIME_US` can be in, plus a day.
    const LAST_DAY: i32 = (MAX_TIME_US / DAY) as i32 + 2;

    fn word() -> impl Strategy<Value = PeriodWord> {
        (
            -31..=LAST_DAY,
            proptest::sample::select(LENGTHS.to_vec()),
            -72i8..=72,
            any::<u32>(),
        )
            .prop_map(|(first_day, days, quarters, count)| {
                PeriodWord {
                    first_day,
                    days,
                    quarters,
                    count,
                }
            })
    }

    proptest! {
        #[test]
        fn a_word_unpacks_to_what_was_packed(kept in word(), locked: bool) {
            let packed = kept.pack().expect("in range");
            prop_assert!(packed & PERIOD != 0);
            prop_assert_eq!(packed & LOCKED, 0);
            let seen = if locked { packed | LOCKED } else { packed };
            prop_assert_eq!(PeriodWord::unpack(seen), Some(kept));
            // The count is the low word: a new count keeps the period.
            let recounted = PeriodWord::with_count(seen, 7);
            prop_assert_eq!(
                PeriodWord::unpack(recounted),
                Some(PeriodWord { count: 7, ..kept })
            );
        }

        /// The word a decision writes gives back the calendar's bounds of
        /// its period, at any instant and any offset in seconds.
        #[test]
        fn a_words_bounds_are_the_calendars(
            now in prop_oneof![0..90 * DAY, 0..MAX_TIME_US - 32 * DAY],
            unit in prop_oneof![
                Just(PeriodUnit::Day),
                Just(PeriodUnit::Week),
                Just(PeriodUnit::Month),
            ],
            offset_s in prop_oneof![
                (-72i32..=72).prop_map(|q| q * 900),
                -MAX_OFFSET_S..=MAX_OFFSET_S,
            ],
        ) {
            let period = Period::new(10, unit, offset_s).expect("valid");
            let (decided, write) = decide(&period, 0, now, 1).expect("in range");
            prop_assert!(decided.allowed);
            let kept = PeriodWord::unpack(write.expect("a pass writes"));
            let kept = kept.expect("a period's word");
            prop_assert_eq!(kept.count, 1);
            let calendar = (
                period.start_of(now).expect("in range"),
                period.next_start(now).expect("in range"),
            );
            prop_assert_eq!(kept.bounds(offset_s), calendar);
            // The sweeper's expiry: never before the next start, and at
            // most a quarter hour after it.
            let dead = expiry(write.expect("written"));
            prop_assert!(dead >= calendar.1);
            prop_assert!(dead - calendar.1 < 900_000_000);
            if offset_s % 900 == 0 {
                prop_assert_eq!(dead, calendar.1);
            }
        }
    }

    #[test]
    fn every_length_code_and_the_extremes_round_trip() {
        for &days in &LENGTHS {
            for first_day in [-31, 0, LAST_DAY] {
                for quarters in [-72, 0, 72] {
                    for count in [0, 1, u32::MAX] {
                        let kept = PeriodWord {
                            first_day,
                            days,
                            quarters,
                            count,
                        };
                        let packed = kept.pack().expect("in range");
                        assert_eq!(PeriodWord::unpack(packed), Some(kept));
                    }
                }
            }
        }
        let out = |kept: PeriodWord| kept.pack();
        let base = PeriodWord {
            first_day: 0,
            days: 1,
            quarters: 0,
            count: 0,
        };
        assert_eq!(out(PeriodWord { days: 2, ..base }), None);
        assert_eq!(
            out(PeriodWord {
                quarters: 73,
                ..base
            }),
            None
        );
        assert_eq!(
            out(PeriodWord {
                first_day: -33,
                ..base
            }),
            None
        );
        assert_eq!(
            out(PeriodWord {
                first_day: 1 << 17,
                ..base
            }),
            None
        );
    }

    #[test]
    fn other_words_are_no_period() {
        // Nothing, a rate's TAT (at most 2^53), a locked TAT, a length code
        // no period has.
        for word in [0, 1, MAX_TIME_US, MAX_TIME_US | LOCKED] {
            assert_eq!(PeriodWord::unpack(word), None, "{word}");
        }
        assert_eq!(PeriodWord::unpack(PERIOD | 6 << 49), None);
        assert_eq!(PeriodWord::unpack(PERIOD | 73 << 53), None);
        // A rate's TAT is its own expiry; a broken period word is dead.
        assert_eq!(expiry(MAX_TIME_US | LOCKED), MAX_TIME_US);
        assert_eq!(expiry(PERIOD | 7 << 49), 0);
    }

    #[test]
    fn a_word_of_another_unit_is_decided_by_the_calendar() {
        // A day's word read by a monthly rule (a reload changed the unit):
        // not decided in the day's bounds, but by the calendar, which
        // carries the day's count into its month.
        let now = 19_754 * DAY + 5; // 2024-02-01
        let daily = Period::new(3, PeriodUnit::Day, 0).expect("valid");
        let monthly = Period::new(3, PeriodUnit::Month, 0).expect("valid");
        let (_, word) = decide(&daily, 0, now, 2).expect("in range");
        let word = word.expect("written");
        let later = now + 3 * DAY;
        let (decided, rewritten) =
            decide(&monthly, word, later, 1).expect("in range");
        assert_eq!(decided.remaining, 0);
        assert_eq!(decided.reset_after_us, 29 * DAY - 3 * DAY - 5);
        let kept = PeriodWord::unpack(rewritten.expect("written"));
        assert_eq!(kept.map(|k| (k.days, k.count)), Some((29, 3)));
        // A day's count is gone the next day.
        let (decided, _) = decide(&daily, word, now + DAY, 0).expect("ok");
        assert_eq!(decided.remaining, 3);
    }

    #[test]
    fn a_word_of_another_unit_is_placed_by_the_calendar() {
        // 2026-12-09T12:00Z, a Wednesday in the middle of its month.
        const NOW: u64 = 1_796_817_600_000_000;
        let [daily, weekly, monthly] =
            [PeriodUnit::Day, PeriodUnit::Week, PeriodUnit::Month]
                .map(|unit| Period::new(5, unit, 0).unwrap());
        // A word each unit wrote, then read by a limit reloaded to another
        // unit: as gcra-core places a stored start, never in the old
        // word's bounds.
        for (wrote, reads) in
            [(daily, weekly), (daily, monthly), (monthly, daily)]
        {
            let (first, word) = decide(&wrote, 0, NOW, 1).unwrap();
            let start = first.write.unwrap().start_us;
            let (decided, _) =
                decide(&reads, word.unwrap(), NOW + 1, 1).unwrap();
            let calendar = reads.check(Some((start, 1)), NOW + 1, 1).unwrap();
            assert_eq!(decided, calendar, "{wrote:?} read as {reads:?}");
        }
    }

    #[test]
    fn a_month_begun_before_the_epoch_is_a_word_of_31_days() {
        // At the epoch, an hour behind UTC: December 1969, local, its
        // start clamped to 0; an hour ahead, January 1970, the same.
        for offset_s in [-3600, 3600] {
            let monthly = Period::new(5, PeriodUnit::Month, offset_s).unwrap();
            let (decided, word) = decide(&monthly, 0, 0, 1).unwrap();
            assert!(decided.allowed);
            let word = PeriodWord::unpack(word.unwrap()).unwrap();
            assert_eq!((word.days, word.count), (31, 1), "{offset_s}");
        }
    }

    #[test]
    fn a_word_read_before_its_start_is_rewritten_as_the_decisions_period() {
        // 2026-12-09T12:00Z, then the clock back a day.
        const NOW: u64 = 1_796_817_600_000_000;
        const DAY: u64 = 86_400_000_000;
        let daily = Period::new(5, PeriodUnit::Day, 0).unwrap();
        let (_, word) = decide(&daily, 0, NOW, 1).unwrap();
        let (decided, word) =
            decide(&daily, word.unwrap(), NOW - DAY, 1).unwrap();
        let start = decided.write.unwrap().start_us;
        let word = PeriodWord::unpack(word.unwrap()).unwrap();
        assert_eq!(word.bounds(0).0, start);
        assert_eq!(start, NOW - DAY - DAY / 2);
    }

    #[test]
    fn a_period_alone_is_decided_in_place_and_its_loop_ends() {
        const NOW: u64 = 1_796_817_600_000_000;
        // On a thread of its own: a loop that never ends fails the test
        // after a second instead of hanging it.
        let (sent, got) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let daily = Period::new(2, PeriodUnit::Day, 0).unwrap();
            let name = crate::LimitName::new("daily").unwrap();
            let rule = crate::rule::Rule::Period(daily);
            let check =
                crate::BucketCheck::of_rule(&name, "ana", rule, 1).unwrap();
            let cell = crate::sync::AtomicU64::new(0);
            let mut out = gcra_core::Decision::default();
            let passes = [(); 3].map(|()| {
                super::decide_in_place(&cell, &daily, &check, NOW, &mut out)
                    .unwrap()
                    .allowed
            });
            sent.send(passes)
        });
        let passes = got
            .recv_timeout(std::time::Duration::from_secs(1))
            .expect("the loop ends");
        assert_eq!(passes, [true, true, false]);
    }
}
