//! What a decision came to ([`Ruling`]) and what it tells whoever listens
//! ([`Events`]), the two halves of a [`Judged`] decision.

use std::borrow::Cow;

use http::StatusCode;
use rate_tier_storage::StorageError;

use crate::error::Error;
use crate::event::LimitEvent;
use crate::observe::Outcome;
use crate::outcome::{Admitted, LimitReason, Limited};

/// What a decision came to.
#[derive(Debug)]
pub(crate) enum Ruling {
    /// Passed, charged to every bucket.
    Allowed(Admitted),
    /// Passed unchecked by an explicit policy (an unknown tier allowed, a
    /// store or identity failure with fail-open).
    Unlimited,
    /// Refused by a limit (429), or never passing (403).
    Limited(Limited),
    /// Refused before any limit applied: no identity.
    Denied(StatusCode),
    /// Refused because something needed failed (the store, the identity
    /// lookup): transient, answered with `retry-after`.
    Unavailable {
        status: StatusCode,
        /// The store's error; `None` for a failed identity lookup.
        error: Option<StorageError>,
    },
    /// A bug or a broken clock: 500.
    Invalid(Error),
}

impl Ruling {
    /// The configured tier whose quota applied, if any: never a name a
    /// client sent (metrics labels stay bounded).
    pub(crate) fn tier(&self) -> Option<&'static str> {
        let name = match self {
            Ruling::Allowed(info) => &info.tier,
            Ruling::Limited(limited) => &limited.tier,
            _ => return None,
        };
        match name {
            Cow::Borrowed(name) => Some(name),
            Cow::Owned(_) => None,
        }
    }

    /// What happened, for observers.
    pub(crate) fn outcome(&self) -> Outcome {
        match self {
            Ruling::Allowed(info) if info.shadow_limited() => {
                Outcome::ShadowLimited
            }
            Ruling::Allowed(_) => Outcome::Allowed,
            Ruling::Unlimited => Outcome::Unlimited,
            Ruling::Limited(limited) => match limited.reason {
                LimitReason::RateLimited => Outcome::Limited,
                LimitReason::Banned => Outcome::Banned,
                LimitReason::CostExceedsBurst { .. } => {
                    Outcome::CostExceedsBurst
                }
                LimitReason::UnknownTier => Outcome::UnknownTierDenied,
            },
            Ruling::Denied(_) => Outcome::MissingIdentity,
            Ruling::Unavailable { error: Some(_), .. } => Outcome::StorageError,
            Ruling::Unavailable { error: None, .. } => Outcome::IdentityError,
            Ruling::Invalid(_) => Outcome::Invalid,
        }
    }
}

/// The events of one decision, handed back with its ruling for the caller
/// to report. When nobody listens none is built (and no copy of a user id
/// is made): [`Events::push`] does not even call its closure. Three words,
/// nothing allocated until an event is pushed: it travels with every
/// decision.
#[derive(Debug, Default)]
pub(crate) struct Events(Option<Vec<LimitEvent>>);

impl Events {
    /// Events for someone who listens (`true`), or for no one.
    #[inline]
    pub(crate) fn new(listening: bool) -> Self {
        Events(listening.then(Vec::new))
    }

    /// Whether anyone listens.
    pub(crate) fn listening(&self) -> bool {
        self.0.is_some()
    }

    /// Adds the event `make` builds, if anyone listens.
    #[inline]
    pub(crate) fn push(&mut self, make: impl FnOnce() -> LimitEvent) {
        if let Some(events) = &mut self.0 {
            events.push(make());
        }
    }

    /// The events, in order.
    pub(crate) fn drain(self) -> impl Iterator<Item = LimitEvent> {
        self.0.into_iter().flatten()
    }
}

/// A decision made: its ruling, the store that made it, and what it tells.
#[derive(Debug)]
pub(crate) struct Judged {
    pub(crate) ruling: Ruling,
    /// The store that decided (`"none"` when none was asked).
    pub(crate) by: &'static str,
    pub(crate) events: Events,
}
