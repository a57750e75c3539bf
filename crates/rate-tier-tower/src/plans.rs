//! The set of tiers and policies a limiter applies, replaceable at runtime.

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};

use gcra_core::Quota;
use http::StatusCode;
use rate_tier_storage::key::validate_tier_name;

use crate::{ConfigError, OnMissing, OnStorageError, OnUnknownTier};

#[derive(Debug, Clone, Copy)]
pub(crate) struct Tier {
    /// Interned: copying it into every decision costs no atomic operation.
    pub(crate) name: &'static str,
    pub(crate) quota: Quota,
}

/// A validated set of tiers (plans) with the policies for what does not fit.
///
/// A [`RateTier`](crate::RateTier) applies one `Plans` at a time, and
/// [`RateTier::reload`](crate::RateTier::reload) replaces it while requests
/// run. Buckets are keyed by tier name and user, and GCRA keeps one TAT per
/// bucket whatever the quota, so a user keeps what they spent across a
/// reload; a smaller burst caps their bucket instead of locking them out.
///
/// ```
/// use tower_rate_tier::{Plans, Quota};
/// let plans = Plans::builder()
///     .tier("free", Quota::per_minute(10))
///     .tier("pro", Quota::per_minute(100))
///     .default_tier("free")
///     .build()?;
/// assert_eq!(plans.quota("pro"), Some(Quota::per_minute(100)));
/// assert_eq!(plans.default_tier(), Some("free"));
/// assert_eq!(plans.tier_names().collect::<Vec<_>>(), ["free", "pro"]);
/// # Ok::<(), tower_rate_tier::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Plans {
    pub(crate) tiers: Vec<Tier>,
    pub(crate) default_tier: Option<usize>,
    pub(crate) on_missing: OnMissing,
    pub(crate) on_unknown_tier: OnUnknownTier,
    pub(crate) on_storage_error: OnStorageError,
    /// Which policies were set, not defaulted: a reload keeps the running
    /// ones for the others.
    explicit: Explicit,
}

#[derive(Debug, Clone, Copy, Default)]
struct Explicit {
    on_missing: bool,
    on_unknown_tier: bool,
    on_storage_error: bool,
}

impl Plans {
    /// Configures a set of plans.
    pub fn builder() -> PlansBuilder {
        PlansBuilder::default()
    }

    /// The quota of a configured tier.
    pub fn quota(&self, tier: &str) -> Option<Quota> {
        self.find(tier).map(|t| t.quota)
    }

    /// The default tier, if one is set.
    pub fn default_tier(&self) -> Option<&'static str> {
        self.default_tier.map(|i| self.tiers[i].name)
    }

    /// The configured tier names, in configuration order.
    pub fn tier_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.tiers.iter().map(|t| t.name)
    }

    /// The storage error policy.
    pub fn on_storage_error(&self) -> OnStorageError {
        self.on_storage_error
    }

    /// For a reload: each policy these plans did not set is taken from
    /// `running`, if it was set there and still applies (a policy that
    /// needs a default tier, when these plans have one).
    pub(crate) fn keep_policies_of(&mut self, running: &Plans) {
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
    }

    pub(crate) fn find(&self, tier: &str) -> Option<Tier> {
        self.tiers.iter().find(|t| t.name == tier).copied()
    }

    pub(crate) fn default_entry(&self) -> Option<Tier> {
        self.default_tier.map(|i| self.tiers[i])
    }
}

/// Builds [`Plans`]. Every setting has a safe default; see each method.
#[derive(Debug, Default, Clone)]
#[must_use]
pub struct PlansBuilder {
    tiers: Vec<(String, Quota)>,
    default_tier: Option<String>,
    on_missing: Option<OnMissing>,
    on_unknown_tier: Option<OnUnknownTier>,
    on_storage_error: Option<OnStorageError>,
}

impl PlansBuilder {
    /// Adds a tier (plan): a name of 1 to 64 `[A-Za-z0-9_.-]` and its quota.
    pub fn tier(mut self, name: impl Into<String>, quota: Quota) -> Self {
        self.tiers.push((name.into(), quota));
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

    /// Validates the plans.
    ///
    /// ```
    /// use tower_rate_tier::{ConfigError, OnMissing, Plans, Quota};
    /// use http::StatusCode;
    /// let err = Plans::builder()
    ///     .tier("free", Quota::per_minute(10))
    ///     .default_tier("gold")
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err, ConfigError::UnknownDefaultTier("gold".into()));
    ///
    /// // A refusal must look like one.
    /// let err = Plans::builder()
    ///     .tier("free", Quota::per_minute(10))
    ///     .on_missing(OnMissing::Deny(StatusCode::OK))
    ///     .build()
    ///     .unwrap_err();
    /// assert!(matches!(err, ConfigError::NotAnErrorStatus { .. }));
    /// ```
    pub fn build(self) -> Result<Plans, ConfigError> {
        if self.tiers.is_empty() {
            return Err(ConfigError::NoTiers);
        }
        let mut tiers: Vec<Tier> = Vec::with_capacity(self.tiers.len());
        for (name, quota) in self.tiers {
            validate_tier_name(&name)?;
            if tiers.iter().any(|t| t.name == name) {
                return Err(ConfigError::DuplicateTier(name));
            }
            tiers.push(Tier {
                name: intern(&name),
                quota,
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
        Ok(Plans {
            tiers,
            default_tier,
            on_missing,
            on_unknown_tier,
            on_storage_error: self.on_storage_error.unwrap_or_default(),
            explicit: Explicit {
                on_missing: self.on_missing.is_some(),
                on_unknown_tier: self.on_unknown_tier.is_some(),
                on_storage_error: self.on_storage_error.is_some(),
            },
        })
    }
}

/// The `&'static` copy of a tier name, made once per distinct name for the
/// life of the process (names come from configuration, never from requests,
/// so the set is small and bounded, reloads included).
fn intern(name: &str) -> &'static str {
    static NAMES: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(interned) = names.get(name) {
        return interned;
    }
    let interned: &'static str = Box::leak(name.into());
    names.insert(interned);
    interned
}

#[cfg(feature = "plans-toml")]
mod toml_file {
    use std::collections::BTreeMap;
    use std::fmt;
    use std::ops::Range;
    use std::time::Duration;

    use gcra_core::Quota;
    use rate_tier_storage::key::validate_tier_name;
    use serde::Deserialize;
    use toml::Spanned;

    use super::PlansBuilder;

    /// Why a plans file was refused, and where.
    ///
    /// ```
    /// # use tower_rate_tier::Plans;
    /// let err = Plans::builder()
    ///     .from_toml("[tiers.free]\nlimit = 0\nper = \"minute\"\n")
    ///     .unwrap_err();
    /// assert_eq!(err.line(), 2);
    /// assert_eq!(err.to_string(), "line 2: limit must be at least 1");
    /// ```
    #[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
    #[error("line {line}: {message}")]
    pub struct PlansError {
        line: usize,
        message: String,
    }

    impl PlansError {
        fn at(
            text: &str,
            span: Option<Range<usize>>,
            message: impl fmt::Display,
        ) -> Self {
            let start = span.map_or(0, |span| span.start.min(text.len()));
            let line = text.as_bytes().get(..start).map_or(1, |before| {
                before.iter().filter(|b| **b == b'\n').count() + 1
            });
            PlansError {
                line,
                message: message.to_string(),
            }
        }

        /// The 1-based line of the problem.
        pub fn line(&self) -> usize {
            self.line
        }

        /// What is wrong, without the line.
        pub fn message(&self) -> &str {
            &self.message
        }
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        default_tier: Option<Spanned<String>>,
        #[serde(default)]
        tiers: BTreeMap<Spanned<String>, Spanned<TierDef>>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct TierDef {
        limit: Spanned<u32>,
        per: Spanned<Per>,
        burst: Option<Spanned<u32>>,
    }

    #[derive(Deserialize, Clone, Copy)]
    #[serde(rename_all = "lowercase")]
    enum Per {
        Second,
        Minute,
        Hour,
        Day,
    }

    impl Per {
        fn period(self) -> Duration {
            Duration::from_secs(match self {
                Per::Second => 1,
                Per::Minute => 60,
                Per::Hour => 3600,
                Per::Day => 86_400,
            })
        }
    }

    impl PlansBuilder {
        /// Adds the tiers (and default tier) of a TOML plans file to these
        /// plans; policies stay as set in code. Feature `plans-toml`.
        ///
        /// ```toml
        /// default_tier = "free"        # optional
        /// [tiers.free]
        /// limit = 10
        /// per = "minute"               # second | minute | hour | day
        /// # burst = 10                 # optional, defaults to limit
        /// [tiers.pro]
        /// limit = 100
        /// per = "minute"
        /// ```
        ///
        /// Unknown fields, a zero limit or burst, a bad tier name or a
        /// default tier that is not defined are errors that name the line.
        ///
        /// ```
        /// use tower_rate_tier::{OnMissing, Plans, Quota};
        /// use http::StatusCode;
        ///
        /// let plans = Plans::builder()
        ///     .on_missing(OnMissing::Deny(StatusCode::UNAUTHORIZED))
        ///     .from_toml(r#"
        ///         default_tier = "free"
        ///         [tiers.free]
        ///         limit = 10
        ///         per = "minute"
        ///         [tiers.pro]
        ///         limit = 100
        ///         per = "minute"
        ///         burst = 20
        ///     "#)?
        ///     .build()?;
        /// assert_eq!(plans.quota("pro"), Some(Quota::per_minute(100).allow_burst(20)));
        ///
        /// let typo = Plans::builder().from_toml("[tiers.free]\nlimit = 10\nper = \"minute\"\nbrust = 5\n");
        /// assert_eq!(typo.unwrap_err().line(), 4);
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        pub fn from_toml(
            mut self,
            text: &str,
        ) -> Result<PlansBuilder, PlansError> {
            let file: File = toml::from_str(text)
                .map_err(|e| PlansError::at(text, e.span(), e.message()))?;
            for (name, tier) in &file.tiers {
                validate_tier_name(name.get_ref())
                    .map_err(|e| PlansError::at(text, Some(name.span()), e))?;
                let tier = tier.get_ref();
                if *tier.limit.get_ref() == 0 {
                    return Err(PlansError::at(
                        text,
                        Some(tier.limit.span()),
                        "limit must be at least 1",
                    ));
                }
                let quota = Quota::new(
                    *tier.limit.get_ref(),
                    tier.per.get_ref().period(),
                )
                .map_err(|e| {
                    PlansError::at(text, Some(tier.limit.span()), e)
                })?;
                let quota = match &tier.burst {
                    None => quota,
                    Some(burst) => {
                        quota.try_allow_burst(*burst.get_ref()).map_err(
                            |e| PlansError::at(text, Some(burst.span()), e),
                        )?
                    }
                };
                self = self.tier(name.get_ref().clone(), quota);
            }
            if let Some(default) = &file.default_tier {
                if !file
                    .tiers
                    .keys()
                    .any(|name| name.get_ref() == default.get_ref())
                {
                    return Err(PlansError::at(
                        text,
                        Some(default.span()),
                        format!(
                            "default tier {:?} is not defined",
                            default.get_ref()
                        ),
                    ));
                }
                self = self.default_tier(default.get_ref().clone());
            }
            Ok(self)
        }
    }
}

#[cfg(feature = "plans-toml")]
pub use toml_file::PlansError;
