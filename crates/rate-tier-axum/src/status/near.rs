//! [`Near`]: the users nearest their limit, a bounded list.

/// At most this many users are kept as near their limit.
const NEAR_KEPT: usize = 32;
/// At most this many are shown.
const NEAR_SHOWN: usize = 10;
/// A user is near their limit "now" for this long after they were seen.
const NEAR_FOR_US: u64 = 60_000_000;

/// What a user near their limit got, nearest first (the list's order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Answer {
    Banned,
    Refused,
    Near,
}

impl Answer {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Answer::Banned => "banned",
            Answer::Refused => "refused",
            Answer::Near => "near",
        }
    }
}

/// A user seen near their limit.
#[derive(Debug, Clone)]
pub(super) struct NearUser {
    /// The user's tag, or the id with `keys_in_clear`.
    pub(super) user: String,
    pub(super) tier: &'static str,
    /// The limit; none for a ban.
    pub(super) limit: Option<&'static str>,
    pub(super) remaining: u64,
    /// The limit's size, when the event gives it.
    pub(super) of: Option<u32>,
    pub(super) answer: Answer,
    pub(super) seen_us: u64,
}

impl NearUser {
    fn same(&self, other: &NearUser) -> bool {
        self.user == other.user
            && self.tier == other.tier
            && self.limit == other.limit
    }

    /// Banned, then refused, then by the share of the limit left (cross
    /// multiplied: no floats); nearest first.
    fn nearness(&self, other: &NearUser) -> std::cmp::Ordering {
        let share = |a: &NearUser, b: &NearUser| {
            u128::from(a.remaining) * u128::from(b.of.unwrap_or(1).max(1))
        };
        self.answer
            .cmp(&other.answer)
            .then_with(|| share(self, other).cmp(&share(other, self)))
    }
}

/// The users near their limit: at most [`NEAR_KEPT`], whatever the
/// traffic.
#[derive(Debug, Default)]
pub(super) struct Near(Vec<NearUser>);

impl Near {
    pub(super) fn saw(&mut self, seen: NearUser) {
        if let Some(kept) = self.0.iter_mut().find(|k| k.same(&seen)) {
            *kept = seen;
            return;
        }
        if self.0.len() < NEAR_KEPT {
            self.0.push(seen);
            return;
        }
        // Full: the stalest goes if it is older than a minute, else the
        // farthest from its limit if the new one is nearer.
        let stalest = self.0.iter_mut().min_by_key(|k| k.seen_us);
        if let Some(stale) = stalest
            && stale.seen_us.saturating_add(NEAR_FOR_US) < seen.seen_us
        {
            *stale = seen;
            return;
        }
        let farthest = self.0.iter_mut().max_by(|a, b| a.nearness(b));
        if let Some(far) = farthest
            && seen.nearness(far).is_lt()
        {
            *far = seen;
        }
    }

    #[cfg(test)]
    pub(super) fn kept(&self) -> usize {
        self.0.len()
    }

    /// Those seen in the last minute, nearest first, then newest.
    pub(super) fn now(&self, now_us: u64) -> Vec<NearUser> {
        let mut recent: Vec<NearUser> = self
            .0
            .iter()
            .filter(|k| k.seen_us.saturating_add(NEAR_FOR_US) >= now_us)
            .cloned()
            .collect();
        recent.sort_by(|a, b| {
            a.nearness(b).then_with(|| b.seen_us.cmp(&a.seen_us))
        });
        recent.truncate(NEAR_SHOWN);
        recent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, remaining: u64, seen_us: u64) -> NearUser {
        NearUser {
            user: name.into(),
            tier: "free",
            limit: Some("free"),
            remaining,
            of: Some(10),
            answer: if remaining == 0 {
                Answer::Refused
            } else {
                Answer::Near
            },
            seen_us,
        }
    }

    #[test]
    fn near_users_are_bounded_and_the_nearest_stay() {
        let mut near = Near::default();
        for i in 0..1000u64 {
            near.saw(user(&format!("u{i}"), 1 + i % 9, 5));
        }
        assert_eq!(near.0.len(), NEAR_KEPT);
        near.saw(user("refused", 0, 5));
        let shown = near.now(5);
        assert_eq!(shown.len(), NEAR_SHOWN);
        assert_eq!(shown[0].user, "refused");
        assert!(shown.iter().skip(1).all(|k| k.remaining == 1), "{shown:?}");
        // A minute later none is near "now"; new ones take stale places.
        assert!(near.now(5 + NEAR_FOR_US + 1).is_empty());
        near.saw(user("later", 8, NEAR_FOR_US + 100));
        assert_eq!(near.now(NEAR_FOR_US + 100)[0].user, "later");
    }
}
