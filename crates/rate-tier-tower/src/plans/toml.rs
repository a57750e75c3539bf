//! Plans from a TOML file (feature `plans-toml`).

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
    #[cfg_attr(docsrs, doc(cfg(feature = "plans-toml")))]
    pub fn from_toml(mut self, text: &str) -> Result<PlansBuilder, PlansError> {
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
            let quota =
                Quota::new(*tier.limit.get_ref(), tier.per.get_ref().period())
                    .map_err(|e| {
                        PlansError::at(text, Some(tier.limit.span()), e)
                    })?;
            let quota = match &tier.burst {
                None => quota,
                Some(burst) => quota
                    .try_allow_burst(*burst.get_ref())
                    .map_err(|e| PlansError::at(text, Some(burst.span()), e))?,
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
