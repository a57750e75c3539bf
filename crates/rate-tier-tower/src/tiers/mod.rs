//! The set of tiers and policies a limiter applies, replaceable at runtime.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use gcra_core::Quota;
use http::StatusCode;
use rate_tier_storage::{LimitName, Rule, RuleKind};

use crate::error::ConfigError;
use crate::policy::{
    OnIdentityError, OnMissing, OnStorageError, OnUnknownTier,
};

/// A configured tier. Its name is interned: copying it into every decision
/// costs no allocation and no atomic operation.
#[derive(Debug, Clone)]
pub(crate) struct Tier {
    pub(crate) name: &'static str,
    /// The same name, as the stores know buckets: in its generation (see
    /// [`LimitName::in_generation`]).
    pub(crate) key: &'static LimitName,
    pub(crate) rule: Rule,
    /// How many reloads changed this tier's kind.
    generation: u32,
}

/// A validated set of tiers (the plans customers are on) with the policies for what does not fit.
///
/// A [`RateTier`](crate::RateTier) applies one `Tiers` at a time, and
/// [`RateTier::reload`](crate::RateTier::reload) replaces it while requests
/// run. Buckets are keyed by tier name and user, and GCRA keeps one TAT per
/// bucket whatever the quota, so a user keeps what they spent across a
/// reload; with a smaller burst, what they spent beyond it is a debt that
/// drains at the rate (never longer than what they spent).
///
/// ```
/// use tower_rate_tier::{Tiers, Quota};
/// let tiers = Tiers::builder()
///     .tier("free", Quota::per_minute(10))
///     .tier("pro", Quota::per_minute(100))
///     .default_tier("free")
///     .build()?;
/// assert_eq!(tiers.quota("pro"), Some(Quota::per_minute(100)));
/// assert_eq!(tiers.default_tier(), Some("free"));
/// assert_eq!(tiers.tier_names().collect::<Vec<_>>(), ["free", "pro"]);
/// # Ok::<(), tower_rate_tier::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Tiers {
    pub(crate) tiers: Vec<Tier>,
    pub(crate) default_tier: Option<usize>,
    pub(crate) on_missing: OnMissing,
    pub(crate) on_unknown_tier: OnUnknownTier,
    pub(crate) on_storage_error: OnStorageError,
    pub(crate) on_identity_error: OnIdentityError,
    /// Which policies were set, not defaulted: a reload keeps the running
    /// ones for the others.
    explicit: Explicit,
}

#[derive(Debug, Clone, Copy, Default)]
struct Explicit {
    on_missing: bool,
    on_unknown_tier: bool,
    on_storage_error: bool,
    on_identity_error: bool,
}

impl Tiers {
    /// Configures a set of tiers.
    pub fn builder() -> TiersBuilder {
        TiersBuilder::default()
    }

    /// The quota of a configured tier, when it is a rate (see
    /// [`Tiers::rule`] for every kind).
    pub fn quota(&self, tier: &str) -> Option<Quota> {
        self.find(tier).and_then(|t| t.rule.as_rate())
    }

    /// What a configured tier enforces: a rate, a window or a period.
    ///
    /// ```
    /// use tower_rate_tier::{Period, PeriodUnit, Tiers, Quota, rules::Rule};
    /// let monthly = Period::new(1000, PeriodUnit::Month, 0)?;
    /// let tiers = Tiers::builder()
    ///     .tier("free", monthly)
    ///     .tier("pro", Quota::per_minute(100))
    ///     .build()?;
    /// assert_eq!(tiers.rule("free"), Some(Rule::Period(monthly)));
    /// assert_eq!(tiers.quota("free"), None);
    /// assert_eq!(tiers.quota("pro"), Some(Quota::per_minute(100)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn rule(&self, tier: &str) -> Option<Rule> {
        self.find(tier).map(|t| t.rule)
    }

    /// For a reload of `running`: the tiers whose kind differs there,
    /// whose buckets start fresh. Each tier of these tiers takes its
    /// generation from `running`, the next one where its kind changed: a
    /// shared store reads one kind's state as absent for another, and an
    /// in-process store keeps each generation's buckets apart, so none
    /// reads what the tier kept under an earlier kind (even one it had
    /// before the last reload, changed back).
    pub(crate) fn kinds_changed_from(
        &mut self,
        running: &Tiers,
    ) -> Vec<String> {
        let mut fresh = Vec::new();
        for tier in &mut self.tiers {
            let Some(old) = running.find(tier.name) else {
                continue;
            };
            tier.generation = old.generation;
            if old.rule.kind() != tier.rule.kind() {
                tier.generation = old.generation.saturating_add(1);
                fresh.push(tier.name.to_owned());
            }
            // Valid: the name was interned when these tiers were built.
            if let Ok(key) = intern_in_generation(
                tier.name,
                Namespace::Tier,
                tier.generation,
            ) {
                tier.key = key;
            }
        }
        fresh
    }

    /// Each tier's name and kind.
    pub(crate) fn kinds(
        &self,
    ) -> impl Iterator<Item = (&'static str, RuleKind)> + '_ {
        self.tiers.iter().map(|t| (t.name, t.rule.kind()))
    }

    /// The default tier, if one is set.
    pub fn default_tier(&self) -> Option<&'static str> {
        self.default_tier.map(|i| self.tiers[i].name)
    }

    /// The configured tier names, in configuration order.
    pub fn tier_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.tiers.iter().map(|t| t.name)
    }

    /// The policy for requests without an identity.
    pub fn on_missing(&self) -> OnMissing {
        self.on_missing
    }

    /// The policy for tiers that are not configured.
    pub fn on_unknown_tier(&self) -> OnUnknownTier {
        self.on_unknown_tier
    }

    /// The storage error policy.
    pub fn on_storage_error(&self) -> OnStorageError {
        self.on_storage_error
    }

    /// The identity lookup error policy.
    pub fn on_identity_error(&self) -> OnIdentityError {
        self.on_identity_error
    }

    /// For a reload: each policy these tiers did not set is taken from
    /// `running`, if it was set there and still applies (a policy that
    /// needs a default tier, when these tiers have one).
    pub(crate) fn keep_policies_of(&mut self, running: &Tiers) {
        let has_default = self.default_tier.is_some();
        if !self.explicit.on_missing && running.explicit.on_missing {
            let applies =
                running.on_missing != OnMissing::UseDefault || has_default;
            if applies {
                self.on_missing = running.on_missing;
                self.explicit.on_missing = true;
            }
        }
        if !self.explicit.on_unknown_tier && running.explicit.on_unknown_tier {
            let applies = running.on_unknown_tier != OnUnknownTier::UseDefault
                || has_default;
            if applies {
                self.on_unknown_tier = running.on_unknown_tier;
                self.explicit.on_unknown_tier = true;
            }
        }
        if !self.explicit.on_storage_error && running.explicit.on_storage_error
        {
            self.on_storage_error = running.on_storage_error;
            self.explicit.on_storage_error = true;
        }
        if !self.explicit.on_identity_error
            && running.explicit.on_identity_error
        {
            self.on_identity_error = running.on_identity_error;
            self.explicit.on_identity_error = true;
        }
    }

    pub(crate) fn find(&self, tier: &str) -> Option<&Tier> {
        self.tiers.iter().find(|t| t.name == tier)
    }

    pub(crate) fn default_entry(&self) -> Option<&Tier> {
        self.default_tier.and_then(|i| self.tiers.get(i))
    }
}

/// Builds [`Tiers`]. Every setting has a safe default; see each method.
#[derive(Debug, Default, Clone)]
#[must_use]
pub struct TiersBuilder {
    tiers: Vec<(String, Rule)>,
    default_tier: Option<String>,
    on_missing: Option<OnMissing>,
    on_unknown_tier: Option<OnUnknownTier>,
    on_storage_error: Option<OnStorageError>,
    on_identity_error: Option<OnIdentityError>,
}

impl TiersBuilder {
    /// Adds a tier (a plan a customer is on): a name of 1 to 64 `[A-Za-z0-9_.-]` and what it
    /// enforces: a rate ([`Quota`]), an exact window
    /// ([`Window`](crate::Window)) or a calendar period
    /// ([`Period`](crate::Period), e.g. 1,000 requests a month).
    pub fn tier(
        mut self,
        name: impl Into<String>,
        rule: impl Into<Rule>,
    ) -> Self {
        self.tiers.push((name.into(), rule.into()));
        self
    }

    /// The tier for requests without an identity ([`OnMissing::UseDefault`])
    /// and for unknown tiers ([`OnUnknownTier::UseDefault`]).
    pub fn default_tier(mut self, name: impl Into<String>) -> Self {
        self.default_tier = Some(name.into());
        self
    }

    /// What a request without identity gets. Default: the default tier if
    /// one is set, else 401 Unauthorized.
    pub fn on_missing(mut self, policy: OnMissing) -> Self {
        self.on_missing = Some(policy);
        self
    }

    /// What a request with an unconfigured tier gets. Default: the default
    /// tier's quota in the user's own bucket if a default tier is set, else
    /// 403 Forbidden. Never unlimited unless [`OnUnknownTier::Allow`].
    pub fn on_unknown_tier(mut self, policy: OnUnknownTier) -> Self {
        self.on_unknown_tier = Some(policy);
        self
    }

    /// What a request gets when the store fails. Default: 503, fail closed.
    pub fn on_storage_error(mut self, policy: OnStorageError) -> Self {
        self.on_storage_error = Some(policy);
        self
    }

    /// What a request gets when its identity lookup fails. Default: 503,
    /// fail closed.
    pub fn on_identity_error(mut self, policy: OnIdentityError) -> Self {
        self.on_identity_error = Some(policy);
        self
    }

    /// Validates the tiers.
    ///
    /// ```
    /// use tower_rate_tier::{ConfigError, OnMissing, Tiers, Quota};
    /// use http::StatusCode;
    /// let err = Tiers::builder()
    ///     .tier("free", Quota::per_minute(10))
    ///     .default_tier("gold")
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err, ConfigError::UnknownDefaultTier("gold".into()));
    ///
    /// // A refusal must look like one.
    /// let err = Tiers::builder()
    ///     .tier("free", Quota::per_minute(10))
    ///     .on_missing(OnMissing::Deny(StatusCode::OK))
    ///     .build()
    ///     .unwrap_err();
    /// assert!(matches!(err, ConfigError::NotAnErrorStatus { .. }));
    /// ```
    pub fn build(self) -> Result<Tiers, ConfigError> {
        if self.tiers.is_empty() {
            return Err(ConfigError::NoTiers);
        }
        let mut tiers: Vec<Tier> = Vec::with_capacity(self.tiers.len());
        for (name, rule) in self.tiers {
            let key = intern(&name, Namespace::Tier)?;
            if tiers.iter().any(|t| t.name == name) {
                return Err(ConfigError::DuplicateTier(name));
            }
            tiers.push(Tier {
                name: key.as_str_static(),
                key,
                rule,
                generation: 0,
            });
        }
        let default_tier = match self.default_tier {
            None => None,
            Some(name) => match tiers.iter().position(|t| t.name == name) {
                Some(index) => Some(index),
                None => return Err(ConfigError::UnknownDefaultTier(name)),
            },
        };
        let refusal = |policy, status: StatusCode| {
            if status.is_client_error() || status.is_server_error() {
                Ok(())
            } else {
                Err(ConfigError::NotAnErrorStatus { policy, status })
            }
        };
        if let Some(OnMissing::Deny(status)) = self.on_missing {
            refusal("OnMissing::Deny", status)?;
        }
        if let Some(OnStorageError::Deny(status)) = self.on_storage_error {
            refusal("OnStorageError::Deny", status)?;
        }
        if let Some(OnIdentityError::Deny(status)) = self.on_identity_error {
            refusal("OnIdentityError::Deny", status)?;
        }
        let has_default = default_tier.is_some();
        let on_missing = match self.on_missing {
            Some(OnMissing::UseDefault) if !has_default => {
                return Err(ConfigError::NoDefaultTier(
                    "OnMissing::UseDefault",
                ));
            }
            Some(policy) => policy,
            None if has_default => OnMissing::UseDefault,
            None => OnMissing::Deny(StatusCode::UNAUTHORIZED),
        };
        let on_unknown_tier = match self.on_unknown_tier {
            Some(OnUnknownTier::UseDefault) if !has_default => {
                return Err(ConfigError::NoDefaultTier(
                    "OnUnknownTier::UseDefault",
                ));
            }
            Some(policy) => policy,
            None if has_default => OnUnknownTier::UseDefault,
            None => OnUnknownTier::Deny,
        };
        Ok(Tiers {
            tiers,
            default_tier,
            on_missing,
            on_unknown_tier,
            on_storage_error: self.on_storage_error.unwrap_or_default(),
            on_identity_error: self.on_identity_error.unwrap_or_default(),
            explicit: Explicit {
                on_missing: self.on_missing.is_some(),
                on_unknown_tier: self.on_unknown_tier.is_some(),
                on_storage_error: self.on_storage_error.is_some(),
                on_identity_error: self.on_identity_error.is_some(),
            },
        })
    }
}

/// Which namespace a name is in: a tier's buckets and a limit's never meet
/// (see [`LimitName::of_limit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Namespace {
    Tier,
    Limit,
}

/// The `&'static` validated copy of a tier or limit name in a
/// `generation` ([`LimitName::in_generation`]), made once per distinct
/// name and generation for the life of the process (names come from
/// configuration, never from requests, and a generation from a reload that
/// changed a tier's kind, so the set is small and bounded). Copying it
/// into a decision costs no allocation and no atomic operation.
pub(crate) fn intern_in_generation(
    name: &str,
    namespace: Namespace,
    generation: u32,
) -> Result<&'static Interned, rate_tier_storage::key::InvalidTierName> {
    type Names = BTreeMap<(Namespace, &'static str, u32), &'static Interned>;
    static NAMES: Mutex<Names> = Mutex::new(BTreeMap::new());
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(interned) = names.get(&(namespace, name, generation)) {
        return Ok(interned);
    }
    // Validated before interning: only valid names are kept.
    rate_tier_storage::key::validate_tier_name(name)?;
    let text: &'static str = Box::leak(name.into());
    let made = match namespace {
        Namespace::Tier => LimitName::new(text)?,
        Namespace::Limit => LimitName::of_limit(text)?,
    };
    let interned: &'static Interned =
        Box::leak(Box::new(made.in_generation(generation)));
    names.insert((namespace, text, generation), interned);
    Ok(interned)
}

/// [`intern_in_generation`] in the first generation.
pub(crate) fn intern(
    name: &str,
    namespace: Namespace,
) -> Result<&'static Interned, rate_tier_storage::key::InvalidTierName> {
    intern_in_generation(name, namespace, 0)
}

/// An interned name.
pub(crate) type Interned = LimitName;

/// The `&'static str` of an interned name.
pub(crate) trait StaticName {
    fn as_str_static(&'static self) -> &'static str;
}

impl StaticName for LimitName {
    fn as_str_static(&'static self) -> &'static str {
        self.as_str()
    }
}

#[cfg(feature = "tiers-toml")]
mod toml;
#[cfg(feature = "tiers-toml")]
pub use self::toml::TiersError;
