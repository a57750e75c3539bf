//! The exact sliding window log: at most `limit` requests in any window of
//! `window` microseconds.

use core::fmt;
use core::ops::Range;
use core::time::Duration;

use crate::{CheckError, Decision, MAX_TIME_US, MAX_WINDOW_US};

/// The largest limit a [`Window`] may have: 1024 requests per window.
///
/// A window log keeps one timestamp per counted request (8 bytes each), so
/// its state grows with the limit: at most 8 KiB per key at this bound. A
/// larger limit is the GCRA's job ([`Quota`](crate::Quota)), whose state is
/// one number whatever the rate.
///
/// ```
/// assert_eq!(gcra_core::MAX_WINDOW_LIMIT, 1024);
/// ```
pub const MAX_WINDOW_LIMIT: u32 = 1024;

/// An exact sliding window: at most `limit` requests in any `window`.
///
/// Unlike a [`Quota`](crate::Quota), which spreads a rate evenly, a window
/// counts: its state is the **log** of the timestamps (µs) of the requests
/// it counts, oldest first, one entry per unit of cost. The store keeps
/// that list (a Redis sorted set or list, a PostgreSQL array, a `Vec`) and
/// applies the [`LogWrite`] each decision returns; the math here reads the
/// log as a slice and never allocates.
///
/// A request made at `t` counts during the `W` microseconds
/// `t, t + 1, ..., t + W - 1`, and has **expired** from `t + W` on: so no
/// `W` consecutive microseconds ever hold more than `limit` passed requests.
///
/// # The rules
///
/// [`Window::check`] decides a request of `cost` at `now` against the
/// stored `log`, with `W` the window and `N` the limit:
///
/// 1. A `now` beyond [`MAX_TIME_US`] is [`CheckError::TimeOutOfRange`]. A
///    cost above `N` can never pass, whatever the wait:
///    [`CheckError::CostExceedsBurst`] with the limit as the burst, decided
///    before the log is read. A cost of 0 is a peek (rule 6).
/// 2. The log must be sorted ascending (equal entries allowed), as the
///    writes of rules 4 and 5 keep it. A log that is not was written by
///    someone else: it is corrupt, read as empty, and replaced whole by the
///    next write.
/// 3. Each entry `t` of a sorted log is, at `now`:
///    - **expired** if `t + W <= now`: not counted, dropped by the next write;
///    - **counted** if `now - W < t <= now`;
///    - **ahead** if `now < t <= MAX_TIME_US` (the clock went back, or
///      another instance's clock runs ahead): counted as if made at `now`,
///      and re-stamped to `now` by the next write, so that a clock that
///      jumped back never holds a request for longer than `W`;
///    - **garbage** beyond [`MAX_TIME_US`]: not counted, dropped by the
///      next write.
///
///    `count` is the number of counted and ahead entries.
/// 4. If `count + cost > N`: refused, `remaining` 0. The
///    `k = count + cost - N` oldest counted entries must expire first:
///    with `e` the k-th oldest (an ahead entry being `now`),
///    `retry_after = e + W - now` (from 1 µs to `W`), and the same request
///    passes exactly then. `reset_after = newest + W - now`, with `newest`
///    the newest counted entry. A refusal charges nothing: its write, if
///    any, only re-stamps the ahead entries (dropping the expired and
///    garbage ones with them), and is `None` when there are none.
/// 5. Else allowed: `remaining = N - count - cost`,
///    `reset_after = W` (the new entries are the newest), and the write
///    drops the expired entries, re-stamps the ahead ones, drops the
///    garbage and appends `cost` entries `now`, with a time to live of
///    `ceil(W / 1000)` ms: by then every entry of the log has expired.
/// 6. A cost of 0 is a peek: allowed, `remaining = N - count` (0 if the
///    log counts more than `N`, after the limit was lowered), `retry_after`
///    0, `reset_after` as in rule 4 (0 for a log that counts nothing), and
///    never a write.
///
/// A log written only by these decisions stays sorted (even when its
/// writers' clocks disagree, since ahead entries are re-stamped) and holds
/// at most `N` entries, at most [`MAX_WINDOW_LIMIT`]: a store may bound
/// its storage by that (a longer log is still read correctly).
///
/// # Example
///
/// Three requests in any 10 s:
///
/// ```
/// use std::time::Duration;
/// use gcra_core::Window;
///
/// const SECOND: u64 = 1_000_000;
/// let window = Window::new(3, Duration::from_secs(10))?;
///
/// // The store's log: requests at 0 s, 4 s and 5 s.
/// let mut log = vec![0, 4 * SECOND, 5 * SECOND];
///
/// // At 9 s all three count: the fourth waits until the one at 0 s
/// // expires, at 10 s.
/// let d = window.check(&log, 9 * SECOND, 1)?;
/// assert!(!d.allowed);
/// assert_eq!(d.retry_after_us, SECOND);
/// assert_eq!(d.reset_after_us, 6 * SECOND); // until the one at 5 s expires
/// assert_eq!(d.write, None);
///
/// // At 10 s it passes: the store drops the expired entry, appends `now`.
/// let d = window.check(&log, 10 * SECOND, 1)?;
/// assert!(d.allowed);
/// assert_eq!(d.remaining, 0);
/// let write = d.write.expect("a pass writes");
/// assert_eq!((write.drop_oldest, write.drop_newest, write.append), (1, 0, 1));
/// let kept = write.kept(log.len());
/// log.truncate(kept.end);
/// log.drain(..kept.start);
/// log.extend(std::iter::repeat_n(write.entry_us, write.append));
/// assert_eq!(log, [4 * SECOND, 5 * SECOND, 10 * SECOND]);
/// assert_eq!(write.ttl_ms, 10_000);
///
/// // Two at once must wait for two entries to expire: at 15 s.
/// let d = window.check(&log, 10 * SECOND, 2)?;
/// assert_eq!(d.retry_after_us, 5 * SECOND);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Window {
    limit: u32,
    window_us: u64,
}

/// Why a [`Window`] could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WindowError {
    /// The limit was 0: no request could ever pass.
    ZeroLimit,
    /// The limit was above [`MAX_WINDOW_LIMIT`]: the log would be too long.
    LimitTooLarge,
    /// The window was shorter than 1 µs.
    ZeroWindow,
    /// The window was longer than [`MAX_WINDOW_US`] (about 35.7 years).
    OutOfRange,
}

impl fmt::Display for WindowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WindowError::ZeroLimit => "window limit must be at least 1",
            WindowError::LimitTooLarge => {
                "window limit exceeds 1024 (MAX_WINDOW_LIMIT)"
            }
            WindowError::ZeroWindow => "window must be at least 1 microsecond",
            WindowError::OutOfRange => "window exceeds 2^50 microseconds",
        })
    }
}

impl core::error::Error for WindowError {}

/// A window as a person says it: `5 in any 30 s`, `100 in any hour`.
///
/// ```
/// use gcra_core::Window;
/// let window = Window::new(5, std::time::Duration::from_secs(7200))?;
/// assert_eq!(window.to_string(), "5 in any 2 h");
/// # Ok::<(), gcra_core::WindowError>(())
/// ```
impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} in any ", self.limit())?;
        crate::quota::write_span(f, self.window())
    }
}

impl Window {
    /// At most `limit` requests in any `window`.
    ///
    /// `limit` is 1 to [`MAX_WINDOW_LIMIT`]; `window` (truncated to the
    /// microsecond) is 1 µs to [`MAX_WINDOW_US`], the longest burst window
    /// a [`Quota`](crate::Quota) may have, so that every entry expires
    /// within [`MAX_TIME_US`] for any clock before the year 2184.
    ///
    /// ```
    /// use std::time::Duration;
    /// use gcra_core::{Window, WindowError};
    ///
    /// let w = Window::new(100, Duration::from_secs(60))?;
    /// assert_eq!((w.limit(), w.window_us()), (100, 60_000_000));
    /// assert_eq!(w.window(), Duration::from_secs(60));
    ///
    /// assert_eq!(Window::new(0, Duration::from_secs(1)), Err(WindowError::ZeroLimit));
    /// assert_eq!(Window::new(1025, Duration::from_secs(1)), Err(WindowError::LimitTooLarge));
    /// assert_eq!(Window::new(1, Duration::from_nanos(999)), Err(WindowError::ZeroWindow));
    /// let forty_years = Duration::from_secs(40 * 365 * 86_400);
    /// assert_eq!(Window::new(1, forty_years), Err(WindowError::OutOfRange));
    /// # Ok::<(), WindowError>(())
    /// ```
    pub const fn new(
        limit: u32,
        window: Duration,
    ) -> Result<Window, WindowError> {
        if limit == 0 {
            return Err(WindowError::ZeroLimit);
        }
        if limit > MAX_WINDOW_LIMIT {
            return Err(WindowError::LimitTooLarge);
        }
        let micros = window.as_micros();
        if micros == 0 {
            return Err(WindowError::ZeroWindow);
        }
        if micros > MAX_WINDOW_US as u128 {
            return Err(WindowError::OutOfRange);
        }
        Ok(Window {
            limit,
            // Lossless: checked against MAX_WINDOW_US just above.
            window_us: micros as u64,
        })
    }

    /// Requests per window.
    pub const fn limit(&self) -> u32 {
        self.limit
    }

    /// The window.
    pub const fn window(&self) -> Duration {
        Duration::from_micros(self.window_us)
    }

    /// The window, in µs: how long an entry of the log counts.
    pub const fn window_us(&self) -> u64 {
        self.window_us
    }

    /// Decides a request of `cost` at `now_us` against the stored `log`
    /// (timestamps in µs, oldest first), by the [rules](Window#the-rules).
    ///
    /// Pure: the store reads the log, calls this, and applies
    /// [`WindowDecision::write`], all atomically for the key. A cost of 0
    /// is a peek. The log may be any slice: unsorted, too long, holding
    /// entries ahead of `now` or beyond [`MAX_TIME_US`]; each case has its
    /// rule.
    ///
    /// ```
    /// use std::time::Duration;
    /// use gcra_core::{CheckError, Window};
    /// let window = Window::new(2, Duration::from_micros(100))?;
    ///
    /// // The clock went back to 50: the entry at 70 counts as made at 50,
    /// // and the pass re-stamps it.
    /// let d = window.check(&[10, 70], 50, 0)?;
    /// assert_eq!((d.allowed, d.remaining, d.write), (true, 0, None)); // a peek
    /// let d = window.check(&[10, 70], 120, 1)?;
    /// let w = d.write.unwrap();
    /// assert_eq!((w.drop_oldest, w.drop_newest, w.append), (1, 0, 1));
    /// let d = window.check(&[30, 70], 50, 1)?;
    /// assert_eq!((d.allowed, d.retry_after_us), (false, 80)); // 30 expires at 130
    /// let w = d.write.unwrap();
    /// assert_eq!((w.drop_oldest, w.drop_newest, w.append, w.entry_us), (0, 1, 1, 50));
    ///
    /// // An unsorted log is corrupt: read as empty, replaced by a pass.
    /// let d = window.check(&[70, 10], 50, 2)?;
    /// let w = d.write.unwrap();
    /// assert_eq!((w.drop_oldest, w.drop_newest, w.append), (2, 0, 2));
    ///
    /// assert_eq!(
    ///     window.check(&[], 0, 3),
    ///     Err(CheckError::CostExceedsBurst { cost: 3, burst: 2 })
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check(
        &self,
        log: &[u64],
        now_us: u64,
        cost: u32,
    ) -> Result<WindowDecision, CheckError> {
        self.decide(Parts::whole(log), now_us, cost, log.is_sorted())
    }

    /// [`Window::check`] of a log its store keeps sorted: one that only
    /// these decisions' writes ever changed (rule 2's "written by someone
    /// else" cannot happen), as an in-process store's. Rule 2's walk over
    /// the whole log is skipped, leaving the binary searches: the same
    /// answer as `check` for every sorted log. An unsorted log is a bug of
    /// the store: debug builds panic, release builds answer without
    /// panicking, but the answer is unspecified.
    ///
    /// ```
    /// use std::time::Duration;
    /// use gcra_core::Window;
    /// let window = Window::new(2, Duration::from_micros(100))?;
    /// let log = [10, 70];
    /// assert_eq!(window.check_sorted(&log, 105, 1)?, window.check(&log, 105, 1)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_sorted(
        &self,
        log: &[u64],
        now_us: u64,
        cost: u32,
    ) -> Result<WindowDecision, CheckError> {
        self.check_sorted_parts([log, &[]], now_us, cost)
    }

    /// [`Window::check_sorted`] of a log held in two parts, `log[0]`'s
    /// entries before `log[1]`'s: a ring buffer's two halves, read where
    /// they lie. The same answer as `check_sorted` of the two joined.
    ///
    /// It reads a few entries at the log's two ends (its oldest, for the
    /// expired ones; its newest, for those ahead of now) and the one a
    /// refusal waits for, searching from each end by doubling steps: a
    /// long log costs a store the cache lines at its ends, not a walk.
    ///
    /// ```
    /// use std::time::Duration;
    /// use gcra_core::Window;
    /// let window = Window::new(3, Duration::from_micros(100))?;
    /// // A ring of 4 holding 10, 40, 70 from its last place.
    /// let ring = [40, 70, 0, 10];
    /// let (newer, older) = ring.split_at(2);
    /// // At 115 the entry of 10 has expired: a pass drops it.
    /// let d = window.check_sorted_parts([&older[1..], newer], 115, 1)?;
    /// assert_eq!(d, window.check(&[10, 40, 70], 115, 1)?);
    /// assert_eq!(d.write.map(|w| (w.drop_oldest, w.append)), Some((1, 1)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_sorted_parts(
        &self,
        log: [&[u64]; 2],
        now_us: u64,
        cost: u32,
    ) -> Result<WindowDecision, CheckError> {
        let parts = Parts { log };
        debug_assert!(parts.is_sorted(), "check_sorted of an unsorted log");
        self.decide(parts, now_us, cost, true)
    }

    /// Rules 1 and 3 to 6, the log `sorted` or not (rule 2).
    fn decide(
        &self,
        log: Parts<'_>,
        now_us: u64,
        cost: u32,
        sorted: bool,
    ) -> Result<WindowDecision, CheckError> {
        // Rule 1.
        if now_us > MAX_TIME_US {
            return Err(CheckError::TimeOutOfRange);
        }
        if cost > self.limit {
            return Err(CheckError::CostExceedsBurst {
                cost,
                burst: self.limit,
            });
        }
        let read = self.read(log, now_us, sorted);
        // The i-th counted entry, oldest first.
        let counted = |i: usize| {
            (i < read.counted)
                .then(|| log.get(read.expired.saturating_add(i)))
                .flatten()
        };
        // Every value here is at most the log's length: no overflow.
        let count = read.counted.saturating_add(read.ahead) as u64;
        let newest = if read.ahead > 0 {
            Some(now_us)
        } else {
            read.counted.checked_sub(1).and_then(counted)
        };
        // A counted entry is after now - W: it expires after now.
        let until_expired = |entry: u64| {
            entry.saturating_add(self.window_us).saturating_sub(now_us)
        };
        let reset_after_us = newest.map_or(0, until_expired);
        let limit = u64::from(self.limit);

        if cost == 0 {
            // Rule 6.
            return Ok(WindowDecision {
                allowed: true,
                remaining: limit.saturating_sub(count),
                retry_after_us: 0,
                reset_after_us,
                write: None,
            });
        }
        let need = count.saturating_add(u64::from(cost));
        if need > limit {
            // Rule 4. 1 <= k <= count, since cost <= limit.
            let k = need.saturating_sub(limit);
            let kth = usize::try_from(k.saturating_sub(1))
                .ok()
                .and_then(counted)
                .unwrap_or(now_us); // beyond the counted: an ahead entry
            return Ok(WindowDecision {
                allowed: false,
                remaining: 0,
                retry_after_us: until_expired(kth),
                reset_after_us,
                write: if read.ahead > 0 {
                    Some(self.write(&read, now_us, 0))
                } else {
                    None
                },
            });
        }
        // Rule 5.
        Ok(WindowDecision {
            allowed: true,
            remaining: limit.saturating_sub(need),
            retry_after_us: 0,
            reset_after_us: self.window_us,
            write: Some(self.write(&read, now_us, cost)),
        })
    }

    /// Rules 2 and 3: the log's entries by kind, oldest first.
    fn read(&self, log: Parts<'_>, now_us: u64, sorted: bool) -> Read {
        let len = log.len();
        if !sorted {
            // Rule 2: corrupt, read as empty and dropped whole.
            return Read {
                expired: len,
                ..Read::default()
            };
        }
        // Sorted, the kinds of rule 3 are runs in this order (now is at
        // most MAX_TIME_US). Each boundary is searched from the end it is
        // usually near: few expired entries, few ahead or garbage ones.
        let at = |i: usize| log.get(i).unwrap_or(u64::MAX);
        let expired = search_from_front(len, |i| {
            at(i).saturating_add(self.window_us) <= now_us
        });
        let ahead_end = search_from_back(len, |i| at(i) <= MAX_TIME_US);
        let counted_end = search_from_back(ahead_end, |i| at(i) <= now_us);
        Read {
            expired,
            counted: counted_end.saturating_sub(expired),
            ahead: ahead_end.saturating_sub(counted_end),
            garbage: len.saturating_sub(ahead_end),
        }
    }

    /// The write that takes the log, read as `read`, to its entries still
    /// counted, the ahead ones re-stamped, and `cost` new ones.
    const fn write(&self, read: &Read, now_us: u64, cost: u32) -> LogWrite {
        LogWrite {
            drop_oldest: read.expired,
            drop_newest: read.ahead.saturating_add(read.garbage),
            append: read.ahead.saturating_add(cost as usize),
            entry_us: now_us,
            ttl_ms: self.window_us.div_ceil(1000),
        }
    }
}

/// A log in two parts, the first's entries before the second's (the whole
/// log and an empty part, for a log in one slice).
#[derive(Debug, Clone, Copy)]
struct Parts<'a> {
    log: [&'a [u64]; 2],
}

impl<'a> Parts<'a> {
    const fn whole(log: &'a [u64]) -> Parts<'a> {
        Parts { log: [log, &[]] }
    }

    const fn len(&self) -> usize {
        self.log[0].len().saturating_add(self.log[1].len())
    }

    /// The `i`-th entry, oldest first.
    #[inline]
    fn get(&self, i: usize) -> Option<u64> {
        let [first, second] = self.log;
        match first.get(i) {
            Some(&entry) => Some(entry),
            None => second.get(i.wrapping_sub(first.len())).copied(),
        }
    }

    fn is_sorted(&self) -> bool {
        let [first, second] = self.log;
        first.is_sorted()
            && second.is_sorted()
            && match (first.last(), second.first()) {
                (Some(last), Some(next)) => last <= next,
                _ => true,
            }
    }
}

/// The first index of `0..len` where `before` is false, for a `before`
/// that is true then false along it: doubling steps from the front, then
/// a binary search. `log2(p)` reads or so for an answer `p`: one when
/// the answer is 0.
#[inline]
fn search_from_front(len: usize, before: impl Fn(usize) -> bool) -> usize {
    // Every index below `low` is before; `high` is not, or is `len`.
    let (mut low, mut step) = (0usize, 1usize);
    let mut high = len;
    while let Some(probe) =
        low.checked_add(step.saturating_sub(1)).filter(|&p| p < len)
    {
        if before(probe) {
            low = probe.saturating_add(1);
            step = step.saturating_mul(2);
        } else {
            high = probe;
            break;
        }
    }
    binary_search(low, high, before)
}

/// [`search_from_front`] from the back: one read when the answer is `len`.
#[inline]
fn search_from_back(len: usize, before: impl Fn(usize) -> bool) -> usize {
    // No index from `high` on is before; `low` is 0, or follows one that is.
    let (mut high, mut step) = (len, 1usize);
    let mut low = 0;
    while let Some(probe) = high.checked_sub(step) {
        if before(probe) {
            low = probe.saturating_add(1);
            break;
        }
        high = probe;
        step = step.saturating_mul(2);
    }
    binary_search(low, high, before)
}

/// The first index of `low..high` where `before` is false (`high` if none),
/// given it is true before `low` and false from `high`.
#[inline]
fn binary_search(
    mut low: usize,
    mut high: usize,
    before: impl Fn(usize) -> bool,
) -> usize {
    while low < high {
        let mid = low.saturating_add(high.saturating_sub(low) / 2);
        if before(mid) {
            low = mid.saturating_add(1);
        } else {
            high = mid;
        }
    }
    low
}

/// A log's entries by kind (rule 3), in the order a sorted log holds them.
#[derive(Debug, Default)]
struct Read {
    expired: usize,
    counted: usize,
    ahead: usize,
    garbage: usize,
}

/// The outcome of [`Window::check`]: the answer, and the one write, if any,
/// the store must make to the log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct WindowDecision {
    /// Whether the request passes.
    pub allowed: bool,
    /// Requests of cost 1 that would still pass right now; 0 when refused.
    pub remaining: u64,
    /// When refused, how long until the same request would pass (exactly,
    /// if nothing else is counted meanwhile); 0 when allowed.
    pub retry_after_us: u64,
    /// How long until every counted entry has expired (the newest counted
    /// entry's expiry minus now); 0 when the log counts nothing.
    pub reset_after_us: u64,
    /// What the store must do to the log, or `None` to leave it as it is.
    /// A pass's write is its charge; a refusal's only repairs the log
    /// (re-stamps entries ahead of now).
    pub write: Option<LogWrite>,
}

impl WindowDecision {
    /// This answer in the shape of a GCRA [`Decision`], with nothing to
    /// store in a TAT: for [`Verdict::of`](crate::Verdict::of) over limits
    /// of several kinds, and for the same response headers.
    ///
    /// ```
    /// let d = gcra_core::WindowDecision { allowed: true, remaining: 4, ..Default::default() };
    /// assert_eq!(d.as_decision().remaining, 4);
    /// assert_eq!(d.as_decision().store, None);
    /// ```
    pub const fn as_decision(&self) -> Decision {
        Decision {
            allowed: self.allowed,
            remaining: self.remaining,
            retry_after_us: self.retry_after_us,
            reset_after_us: self.reset_after_us,
            store: None,
        }
    }
}

/// A change to a stored log, in place: drop `drop_oldest` entries from its
/// start and `drop_newest` from its end (both counted in the log as it was
/// read; together at most its length), then append `append` entries, each
/// `entry_us`; the key may then expire after `ttl_ms`.
///
/// A Redis sorted set applies it with `ZREMRANGEBYRANK` (twice) and `ZADD`,
/// a PostgreSQL array with a slice and `array_fill`, a `Vec` with
/// [`LogWrite::kept`], a fixed buffer with [`LogWrite::apply_in`]. The
/// result is sorted if the log was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LogWrite {
    /// Entries to drop from the start (the oldest): the expired ones, or
    /// the whole of a corrupt log.
    pub drop_oldest: usize,
    /// Entries to drop from the end (the newest): those ahead of now
    /// (re-stamped: they are part of `append`) and those beyond
    /// [`MAX_TIME_US`].
    pub drop_newest: usize,
    /// Entries of `entry_us` to append: the re-stamped ones, then one per
    /// unit of cost.
    pub append: usize,
    /// The timestamp of the appended entries: the decision's `now`.
    pub entry_us: u64,
    /// `ceil(window / 1000)`: when every entry of the new log has expired,
    /// in ms, rounded up. At least 1.
    pub ttl_ms: u64,
}

impl LogWrite {
    /// The entries of the log as read (of length `len`) that the write
    /// keeps, in place: for a store that holds the log in a growable list.
    ///
    /// ```
    /// use std::iter::repeat_n;
    /// let write = gcra_core::LogWrite {
    ///     drop_oldest: 1, drop_newest: 1, append: 2, entry_us: 7, ttl_ms: 1,
    /// };
    /// let mut log = vec![1, 5, 9];
    /// let kept = write.kept(log.len());
    /// assert_eq!(kept, 1..2);
    /// log.truncate(kept.end);
    /// log.drain(..kept.start);
    /// log.extend(repeat_n(write.entry_us, write.append));
    /// assert_eq!(log, [5, 7, 7]);
    /// ```
    pub const fn kept(&self, len: usize) -> Range<usize> {
        let start = if self.drop_oldest < len {
            self.drop_oldest
        } else {
            len
        };
        let end = len.saturating_sub(self.drop_newest);
        Range {
            start,
            end: if end > start { end } else { start },
        }
    }

    /// Applies the write to a log kept in a fixed buffer: the log is
    /// `buffer[..len]` before, and `buffer[..new_len]` after, with
    /// `new_len` returned. `None`, and the buffer untouched, if the new log
    /// does not fit (a buffer of [`Window::limit`] entries always holds
    /// the log of a pass, when the log was written only by decisions of
    /// that window).
    ///
    /// ```
    /// let write = gcra_core::LogWrite {
    ///     drop_oldest: 1, drop_newest: 0, append: 1, entry_us: 12, ttl_ms: 1,
    /// };
    /// let mut buffer = [3, 5, 9];
    /// assert_eq!(write.apply_in(&mut buffer, 3), Some(3));
    /// assert_eq!(buffer, [5, 9, 12]);
    /// let more = gcra_core::LogWrite { drop_oldest: 0, append: 2, ..write };
    /// assert_eq!(more.apply_in(&mut buffer, 3), None);
    /// ```
    pub fn apply_in(&self, buffer: &mut [u64], len: usize) -> Option<usize> {
        let kept = self.kept(len.min(buffer.len()));
        let kept_len = kept.len();
        let new_len = kept_len.checked_add(self.append)?;
        if new_len > buffer.len() {
            return None;
        }
        // kept.end <= buffer.len(): in bounds.
        buffer.copy_within(kept, 0);
        for slot in buffer.get_mut(kept_len..new_len)? {
            *slot = self.entry_us;
        }
        Some(new_len)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use std::sync::mpsc;
    use std::time::Duration;

    use super::{binary_search, search_from_back, search_from_front};

    /// `search` on a thread of its own: one that never ends fails the test
    /// after a second instead of hanging it.
    fn ends(search: impl FnOnce() -> usize + Send + 'static) -> usize {
        let (sent, got) = mpsc::channel();
        std::thread::spawn(move || sent.send(search()));
        got.recv_timeout(Duration::from_secs(1))
            .expect("the search ends")
    }

    #[test]
    fn each_search_finds_the_first_index_not_before_and_ends() {
        const LOG: [u64; 5] = [10, 20, 30, 40, 50];
        for cut in [0, 10, 25, 50, 60] {
            let first = LOG.iter().filter(|&&at| at < cut).count();
            let before = move |i: usize| LOG[i] < cut;
            assert_eq!(ends(move || search_from_front(5, before)), first);
            assert_eq!(ends(move || search_from_back(5, before)), first);
            assert_eq!(ends(move || binary_search(0, 5, before)), first);
        }
        // An empty range asks nothing.
        assert_eq!(ends(|| binary_search(3, 3, |_| unreachable!())), 3);
        assert_eq!(ends(|| search_from_front(0, |_| unreachable!())), 0);
    }
}
