//! The rate tiers in force, resolved once per reload for the tier's own
//! path: a request reads its tier from a few small cells (each a seqlock
//! read and a copy), not from the shared snapshot of the tiers (a
//! reference count taken and given back) nor from a per-thread copy.

use crossbeam_utils::atomic::AtomicCell;
use rate_tier_storage::LimitName;

use crate::policy::OnStorageError;
use crate::tiers::Tiers;

/// How many rate tiers the table holds; a tier beyond them is found on the
/// full path, as every other kind of tier is.
const SLOTS: usize = 8;

/// What the tier's own path needs of a rate tier.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RateTierEntry {
    pub(crate) name: &'static str,
    /// Its buckets' name, in its generation.
    pub(crate) key: &'static LimitName,
    pub(crate) quota: gcra_core::Quota,
    /// The tiers' policy for a store that fails.
    pub(crate) on_storage_error: OnStorageError,
}

/// The rate tiers of the tiers in force, in their order; `None` after the
/// last. A reload writes it after the shared snapshot, under the reloads'
/// lock: a request that reads it mid-reload finds each tier whole, the old
/// or the new.
pub(crate) struct RateTable {
    slots: [AtomicCell<Option<RateTierEntry>>; SLOTS],
}

impl RateTable {
    /// The table of `tiers`.
    pub(crate) fn new(tiers: &Tiers) -> Self {
        let table = RateTable {
            slots: std::array::from_fn(|_| AtomicCell::new(None)),
        };
        table.set(tiers);
        table
    }

    /// Holds the rate tiers of `tiers` from now on.
    pub(crate) fn set(&self, tiers: &Tiers) {
        let mut rates = tiers.tiers.iter().filter_map(|tier| {
            Some(RateTierEntry {
                name: tier.name,
                key: tier.key,
                quota: tier.rule.as_rate()?,
                on_storage_error: tiers.on_storage_error,
            })
        });
        for slot in &self.slots {
            slot.store(rates.next());
        }
    }

    /// The rate tier named `claimed`, if the table holds it.
    #[inline(always)]
    pub(crate) fn find(&self, claimed: &str) -> Option<RateTierEntry> {
        for slot in &self.slots {
            let entry = slot.load()?;
            if same_name(entry.name, claimed) {
                return Some(entry);
            }
        }
        None
    }
}

/// `a == b`, inlined: tier names are short, a call to compare them is not.
/// A name of 4 to 8 bytes is compared as its first and last 4 (which
/// overlap, and cover it), two loads a side instead of a byte loop.
#[inline(always)]
fn same_name(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    match (ends(a), ends(b)) {
        (Some(a), Some(b)) => a == b,
        _ => a.iter().zip(b).all(|(x, y)| x == y),
    }
}

/// The first and the last 4 bytes of a name of 4 to 8 bytes.
#[inline(always)]
fn ends(name: &[u8]) -> Option<(u32, u32)> {
    if name.len() > 8 {
        return None;
    }
    match (name.first_chunk::<4>(), name.last_chunk::<4>()) {
        (Some(first), Some(last)) => {
            Some((u32::from_ne_bytes(*first), u32::from_ne_bytes(*last)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::RateTable;
    use crate::tiers::Tiers;
    use gcra_core::{Quota, Window};
    use std::time::Duration;

    #[test]
    fn holds_the_rate_tiers_of_the_tiers_in_force() {
        let window = Window::new(5, Duration::from_secs(60)).unwrap();
        let tiers = Tiers::builder()
            .tier("free", Quota::per_minute(10))
            .tier("login", window)
            .tier("pro", Quota::per_minute(100))
            .build()
            .unwrap();
        let table = RateTable::new(&tiers);
        let pro = table.find("pro").unwrap();
        assert_eq!((pro.name, pro.quota), ("pro", Quota::per_minute(100)));
        assert_eq!(table.find("free").unwrap().quota, Quota::per_minute(10));
        // A window is decided on the full path; an unknown tier too.
        assert!(table.find("login").is_none());
        assert!(table.find("gold").is_none());
        assert!(table.find("fre").is_none());

        table.set(
            &Tiers::builder()
                .tier("pro", Quota::per_minute(5))
                .build()
                .unwrap(),
        );
        assert_eq!(table.find("pro").unwrap().quota, Quota::per_minute(5));
        assert!(table.find("free").is_none());
    }

    #[test]
    fn names_are_equal_only_when_every_byte_is() {
        let names = [
            "",
            "a",
            "ab",
            "abc",
            "free",
            "frei",
            "pro_1",
            "premium",
            "business",
            "business+",
            "enterprise",
        ];
        for a in names {
            for b in names {
                assert_eq!(super::same_name(a, b), a == b, "{a:?} {b:?}");
            }
            // One byte changed, at each place.
            for i in 0..a.len() {
                let mut other = a.as_bytes().to_vec();
                other[i] ^= 1;
                let other = String::from_utf8(other).unwrap();
                assert!(!super::same_name(a, &other), "{a:?} {other:?}");
            }
        }
    }

    #[test]
    fn more_rate_tiers_than_it_holds_leave_the_rest_to_the_full_path() {
        let mut builder = Tiers::builder();
        for i in 0..10 {
            builder = builder.tier(format!("t{i}"), Quota::per_minute(i + 1));
        }
        let table = RateTable::new(&builder.build().unwrap());
        assert_eq!(table.find("t7").unwrap().quota, Quota::per_minute(8));
        assert!(table.find("t8").is_none());
    }
}
