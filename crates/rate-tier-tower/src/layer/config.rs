//! What a layer was configured with: shared by the layer, its services and
//! the futures they return.

use std::sync::Arc;

use http::HeaderMap;
use http::request::Parts;

use crate::event::LimitEvent;
use crate::headers::HeaderStyle;
use crate::identity::{TierIdentifier, TierIdentity};
use crate::limit::Limit;
use crate::limiter::RateTier;
use crate::observe::Observer;

pub(crate) type IdentifyFn =
    dyn for<'h> Fn(&'h HeaderMap) -> Option<TierIdentity<'h>> + Send + Sync;
pub(super) type CostFn = dyn Fn(&Parts) -> u32 + Send + Sync;
pub(super) type WhenFn = dyn Fn(&Parts) -> bool + Send + Sync;
pub(super) type EventFn = dyn Fn(&LimitEvent) + Send + Sync;

#[derive(Clone)]
pub(crate) enum Identifier {
    /// No identifier configured: every request is anonymous.
    None,
    Headers(Arc<IdentifyFn>),
    Async(Arc<dyn TierIdentifier>),
}

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) tiers: RateTier,
    pub(crate) identifier: Identifier,
    pub(crate) cost: Option<Arc<CostFn>>,
    pub(crate) limits: Vec<Limit>,
    /// The same limits, kept alive for the limiter's checks of reloads
    /// (`limiter/partitions.rs`), when its store needs them.
    pub(crate) kept_limits: Option<Arc<[Limit]>>,
    pub(crate) peek: Option<Arc<WhenFn>>,
    pub(crate) shadow: bool,
    pub(crate) on_event: Option<Arc<EventFn>>,
    pub(crate) observer: Option<Arc<dyn Observer>>,
    pub(crate) headers: HeaderStyle,
}
