//! `/status.json`: the page's content, from the board and the limiter's
//! tiers in force. `/status` is drawn from the same value.

use std::any::Any;

use serde::Serialize;
use tower_rate_tier::policy::{
    OnIdentityError, OnMissing, OnStorageError, OnUnknownTier,
};
use tower_rate_tier::storage::StorageExt;
use tower_rate_tier::{FallbackStorage, RateTier, Tiers};

use super::board::{LimitCounts, LimitHour, StatusBoard, TierCounts, TierHour};
use super::ring::{HOUR_MINUTES, SLOT_US};

/// How often the page refreshes itself.
const REFRESH_SECS: u64 = 5;

#[derive(Debug, Serialize)]
pub(super) struct Status {
    pub(super) uptime_secs: u64,
    pub(super) refresh_secs: u64,
    /// Whether `near_limit` shows ids rather than tags.
    pub(super) keys_in_clear: bool,
    pub(super) store: StoreStatus,
    pub(super) policies: Policies,
    /// The tiers in force in configuration order, then tiers a reload took
    /// out that had checks in the last hour, then checks without a tier
    /// (`name: null`) if any.
    pub(super) tiers: Vec<TierStatus>,
    /// The limits with refusals in the last hour, by name.
    pub(super) limits: Vec<LimitStatus>,
    pub(super) near_limit: Vec<NearStatus>,
    /// Newest first.
    pub(super) reloads: Vec<ReloadStatus>,
}

#[derive(Debug, Serialize)]
pub(super) struct StoreStatus {
    /// The limiter's store, e.g. `memory`, `redis`, `fallback`.
    pub(super) kind: &'static str,
    /// `closed`, `half_open` or `open` for a [`FallbackStorage`].
    pub(super) breaker: Option<&'static str>,
    pub(super) errors_last_minute: u64,
    pub(super) errors_last_hour: Vec<u64>,
    pub(super) last_error: Option<StoreErrorStatus>,
}

#[derive(Debug, Serialize)]
pub(super) struct StoreErrorStatus {
    pub(super) storage: &'static str,
    pub(super) error: String,
    pub(super) secs_ago: u64,
}

#[derive(Debug, Serialize)]
pub(super) struct Policies {
    pub(super) default_tier: Option<&'static str>,
    pub(super) on_missing: String,
    pub(super) on_unknown_tier: String,
    pub(super) on_storage_error: String,
    pub(super) on_identity_error: String,
}

#[derive(Debug, Serialize)]
pub(super) struct TierStatus {
    pub(super) name: Option<&'static str>,
    /// In the tiers in force.
    pub(super) configured: bool,
    pub(super) default: bool,
    /// `rate`, `window`, `period` or `concurrency`; none when not
    /// configured.
    pub(super) kind: Option<&'static str>,
    /// Requests of cost 1 a fresh bucket allows.
    pub(super) limit: Option<u32>,
    /// The rule, readably: `10 per minute`, `1000 per month`.
    pub(super) rule: String,
    pub(super) last_minute: TierCounts,
    pub(super) last_hour: TierHour,
}

#[derive(Debug, Serialize)]
pub(super) struct LimitStatus {
    pub(super) name: &'static str,
    pub(super) last_minute: LimitCounts,
    pub(super) last_hour: LimitHour,
}

#[derive(Debug, Serialize)]
pub(super) struct NearStatus {
    pub(super) tier: &'static str,
    /// The limit; none for a ban.
    pub(super) limit: Option<&'static str>,
    /// A tag (`#3fa2c1d0`), or the id with `keys_in_clear`.
    pub(super) user: String,
    pub(super) remaining: u64,
    pub(super) of: Option<u32>,
    /// `near`, `refused` or `banned`.
    pub(super) answer: &'static str,
    pub(super) seen_secs_ago: u64,
}

#[derive(Debug, Serialize)]
pub(super) struct ReloadStatus {
    pub(super) secs_ago: u64,
    /// `reloaded`, or `refused` (the tiers in force stayed).
    pub(super) result: &'static str,
    pub(super) tiers: Vec<String>,
    pub(super) fresh: Vec<String>,
    pub(super) error: Option<String>,
}

impl StatusBoard {
    /// What `/status.json` answers now: this board's counts with
    /// `limiter`'s tiers, policies and store.
    ///
    /// ```
    /// use rate_tier_axum::status::StatusBoard;
    /// use tower_rate_tier::{Quota, RateTier};
    ///
    /// let limiter = RateTier::builder().tier("free", Quota::per_minute(10)).build();
    /// let json = StatusBoard::new().json(&limiter);
    /// assert!(json.contains(r#""name":"free""#) && json.contains(r#""rule":"10 per minute""#));
    /// ```
    pub fn json(&self, limiter: &RateTier) -> String {
        serde_json::to_string(&Status::of(self, limiter)).unwrap_or_else(
            |error| {
                // Unreachable: the status is structs of strings and numbers.
                serde_json::json!({ "error": error.to_string() }).to_string()
            },
        )
    }
}

impl Status {
    pub(super) fn of(board: &StatusBoard, limiter: &RateTier) -> Status {
        let now_us = board.now_us();
        let now = now_us / SLOT_US;
        let secs_ago = |at_us: u64| now_us.saturating_sub(at_us) / 1_000_000;
        let tiers = limiter.tiers();
        let (errors_last_minute, errors_last_hour, last_error) =
            board.storage_errors(now);
        let store = limiter.storage();
        let fallback =
            (store.as_ref() as &dyn Any).downcast_ref::<FallbackStorage>();
        Status {
            uptime_secs: board.uptime_secs(now_us),
            refresh_secs: REFRESH_SECS,
            keys_in_clear: board.shows_keys_in_clear(),
            store: StoreStatus {
                kind: store.kind(),
                breaker: fallback.map(|f| f.state().as_str()),
                errors_last_minute,
                errors_last_hour,
                last_error: last_error.map(|failure| StoreErrorStatus {
                    storage: failure.storage,
                    error: failure.error,
                    secs_ago: secs_ago(failure.at_us),
                }),
            },
            policies: Policies {
                default_tier: tiers.default_tier(),
                on_missing: on_missing(tiers.on_missing()),
                on_unknown_tier: on_unknown_tier(tiers.on_unknown_tier()),
                on_storage_error: on_storage_error(tiers.on_storage_error()),
                on_identity_error: on_identity_error(tiers.on_identity_error()),
            },
            tiers: tier_statuses(board, &tiers, now),
            limits: board
                .limit_counts(now)
                .into_iter()
                .map(|(name, last_minute, last_hour)| LimitStatus {
                    name,
                    last_minute,
                    last_hour,
                })
                .collect(),
            near_limit: board
                .near_now(now_us)
                .into_iter()
                .map(|near| NearStatus {
                    tier: near.tier,
                    limit: near.limit,
                    user: near.user,
                    remaining: near.remaining,
                    // A refusal by the tier's own limit: its size.
                    of: near.of.or_else(|| {
                        (near.limit == Some(near.tier))
                            .then(|| tiers.rule(near.tier).map(|r| r.limit()))
                            .flatten()
                    }),
                    answer: near.answer.as_str(),
                    seen_secs_ago: secs_ago(near.seen_us),
                })
                .collect(),
            reloads: board
                .reloads()
                .into_iter()
                .map(|reload| ReloadStatus {
                    secs_ago: secs_ago(reload.at_us),
                    result: if reload.error.is_some() {
                        "refused"
                    } else {
                        "reloaded"
                    },
                    tiers: reload.tiers,
                    fresh: reload.fresh,
                    error: reload.error,
                })
                .collect(),
        }
    }
}

/// The tiers in force in configuration order, then tiers a reload took
/// out that had checks in the last hour, then checks without a tier.
fn tier_statuses(
    board: &StatusBoard,
    tiers: &Tiers,
    now: u64,
) -> Vec<TierStatus> {
    let default_tier = tiers.default_tier();
    let mut counted = board.tier_counts(now);
    let mut shown: Vec<TierStatus> = Vec::new();
    for name in tiers.tier_names() {
        let (last_minute, last_hour) =
            match counted.iter().position(|(n, ..)| *n == Some(name)) {
                Some(i) => {
                    let (_, minute, hour) = counted.swap_remove(i);
                    (minute, hour)
                }
                None => no_checks(),
            };
        let rule = tiers.rule(name);
        shown.push(TierStatus {
            name: Some(name),
            configured: true,
            default: default_tier == Some(name),
            kind: rule.map(|r| r.kind().as_str()),
            limit: rule.map(|r| r.limit()),
            rule: rule.map_or_else(String::new, |rule| rule.to_string()),
            last_minute,
            last_hour,
        });
    }
    // Tiers a reload took out, with checks in the hour, then the checks
    // without a tier.
    counted.retain(|(_, _, hour)| !hour.is_empty());
    counted.sort_by_key(|(name, ..)| (name.is_none(), *name));
    for (name, last_minute, last_hour) in counted {
        shown.push(TierStatus {
            name,
            configured: false,
            default: false,
            kind: None,
            limit: None,
            rule: String::new(),
            last_minute,
            last_hour,
        });
    }
    shown
}

/// The counts of a tier that had no check yet.
fn no_checks() -> (TierCounts, TierHour) {
    let zeros = || vec![0; HOUR_MINUTES as usize];
    (
        TierCounts::default(),
        TierHour {
            allowed: zeros(),
            refused: zeros(),
            shadow_limited: zeros(),
            waited: zeros(),
            other: zeros(),
        },
    )
}

fn on_missing(policy: OnMissing) -> String {
    match policy {
        OnMissing::UseDefault => "the default tier".to_owned(),
        OnMissing::Deny(status) => format!("refused, {}", status.as_u16()),
        other => format!("{other:?}"),
    }
}

fn on_unknown_tier(policy: OnUnknownTier) -> String {
    match policy {
        OnUnknownTier::UseDefault => {
            "the default tier, in the user's own bucket".to_owned()
        }
        OnUnknownTier::Deny => "refused, 403".to_owned(),
        OnUnknownTier::Allow => "allowed, unlimited".to_owned(),
        other => other.as_str().to_owned(),
    }
}

fn on_storage_error(policy: OnStorageError) -> String {
    match policy {
        OnStorageError::Deny(status) => {
            format!("refused, {} (fails closed)", status.as_u16())
        }
        OnStorageError::Allow => "allowed unchecked (fails open)".to_owned(),
        other => format!("{other:?}"),
    }
}

fn on_identity_error(policy: OnIdentityError) -> String {
    match policy {
        OnIdentityError::Deny(status) => {
            format!("refused, {} (fails closed)", status.as_u16())
        }
        OnIdentityError::Allow => "allowed unchecked (fails open)".to_owned(),
        other => format!("{other:?}"),
    }
}
