//! Tiers from a TOML file (feature `tiers-toml`).

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::time::Duration;

use gcra_core::{Concurrency, Period, PeriodUnit, Quota, Window};
use rate_tier_storage::key::validate_tier_name;
use serde::Deserialize;
use toml::Spanned;

use super::TiersBuilder;
use rate_tier_storage::Rule;

/// Why a tiers file was refused, and where.
///
/// ```
/// # use tower_rate_tier::Tiers;
/// let err = Tiers::builder()
///     .from_toml("[tiers.free]\nlimit = 0\nper = \"minute\"\n")
///     .unwrap_err();
/// assert_eq!(err.line(), 2);
/// assert_eq!(err.to_string(), "line 2: limit must be at least 1");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct TiersError {
    line: usize,
    message: String,
}

impl TiersError {
    fn at(
        text: &str,
        span: Option<Range<usize>>,
        message: impl fmt::Display,
    ) -> Self {
        let start = span.map_or(0, |span| span.start.min(text.len()));
        let line = text.as_bytes().get(..start).map_or(1, |before| {
            before.iter().filter(|b| **b == b'\n').count() + 1
        });
        TiersError {
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
    kind: Option<Spanned<Kind>>,
    limit: Spanned<u32>,
    per: Option<Spanned<Per>>,
    burst: Option<Spanned<u32>>,
    window_secs: Option<Spanned<u64>>,
    utc_offset: Option<Spanned<String>>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Kind {
    Rate,
    Window,
    Period,
    Concurrency,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum Per {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
}

impl Per {
    /// A rate's period; `None` for the calendar's week and month.
    fn rate_period(self) -> Option<Duration> {
        Some(Duration::from_secs(match self {
            Per::Second => 1,
            Per::Minute => 60,
            Per::Hour => 3600,
            Per::Day => 86_400,
            Per::Week | Per::Month => return None,
        }))
    }

    /// A period's calendar unit; `None` for a second, minute or hour.
    fn calendar_unit(self) -> Option<PeriodUnit> {
        match self {
            Per::Day => Some(PeriodUnit::Day),
            Per::Week => Some(PeriodUnit::Week),
            Per::Month => Some(PeriodUnit::Month),
            Per::Second | Per::Minute | Per::Hour => None,
        }
    }
}

/// `+HH:MM` or `-HH:MM` (or `Z`), in seconds east of UTC.
fn utc_offset_s(text: &str) -> Option<i32> {
    if text == "Z" {
        return Some(0);
    }
    let (sign, rest) = match text.as_bytes().first()? {
        b'+' => (1, &text[1..]),
        b'-' => (-1, &text[1..]),
        _ => return None,
    };
    let (hours, minutes) = rest.split_once(':')?;
    if hours.len() != 2 || minutes.len() != 2 {
        return None;
    }
    let hours: i32 = hours.parse().ok()?;
    let minutes: i32 = minutes.parse().ok()?;
    (minutes < 60).then_some(sign * (hours * 3600 + minutes * 60))
}

/// The rule a tier's fields describe, or what is wrong and where.
fn rule_of(text: &str, tier: &TierDef) -> Result<Rule, TiersError> {
    let at = |span: Range<usize>, message: &dyn fmt::Display| {
        TiersError::at(text, Some(span), message)
    };
    let kind = tier.kind.as_ref().map_or(Kind::Rate, |k| *k.get_ref());
    let kind_name = match kind {
        Kind::Rate => "a rate",
        Kind::Window => "a window",
        Kind::Period => "a period",
        Kind::Concurrency => "a concurrency limit",
    };
    // Fields that belong to another kind are refused, not ignored.
    let misplaced = [
        (tier.burst.as_ref().map(Spanned::span), "burst", Kind::Rate),
        (
            tier.window_secs.as_ref().map(Spanned::span),
            "window_secs",
            Kind::Window,
        ),
        (
            tier.utc_offset.as_ref().map(Spanned::span),
            "utc_offset",
            Kind::Period,
        ),
    ];
    for (span, field, owner) in misplaced {
        if let Some(span) = span
            && owner != kind
        {
            return Err(at(span, &format!("{kind_name} has no {field}")));
        }
    }
    let limit = *tier.limit.get_ref();
    if limit == 0 {
        return Err(at(tier.limit.span(), &"limit must be at least 1"));
    }
    let whole_tier = tier.limit.span();
    match kind {
        Kind::Rate => {
            let per = tier
                .per
                .as_ref()
                .ok_or_else(|| at(whole_tier.clone(), &"a rate needs per"))?;
            let period = per.get_ref().rate_period().ok_or_else(|| {
                at(
                    per.span(),
                    &"a rate's per is second, minute, hour or day: for a calendar week or month, kind = \"period\"",
                )
            })?;
            let quota = Quota::new(limit, period)
                .map_err(|e| at(tier.limit.span(), &e))?;
            Ok(Rule::Rate(match &tier.burst {
                None => quota,
                Some(burst) => quota
                    .try_allow_burst(*burst.get_ref())
                    .map_err(|e| at(burst.span(), &e))?,
            }))
        }
        Kind::Window => {
            if let Some(per) = &tier.per {
                return Err(at(
                    per.span(),
                    &"a window has no per: give window_secs",
                ));
            }
            let secs = tier.window_secs.as_ref().ok_or_else(|| {
                at(whole_tier.clone(), &"a window needs window_secs")
            })?;
            if *secs.get_ref() == 0 {
                return Err(at(secs.span(), &"window_secs must be at least 1"));
            }
            Window::new(limit, Duration::from_secs(*secs.get_ref()))
                .map(Rule::Window)
                .map_err(|e| at(tier.limit.span(), &e))
        }
        Kind::Concurrency => {
            if let Some(per) = &tier.per {
                return Err(at(per.span(), &"a concurrency limit has no per"));
            }
            Concurrency::new(limit)
                .map(Rule::Concurrency)
                .map_err(|e| at(tier.limit.span(), &e))
        }
        Kind::Period => {
            let per = tier.per.as_ref().ok_or_else(|| {
                at(
                    whole_tier.clone(),
                    &"a period needs per (day, week or month)",
                )
            })?;
            let unit = per.get_ref().calendar_unit().ok_or_else(|| {
                at(per.span(), &"a period's per is day, week or month")
            })?;
            let offset_s = match &tier.utc_offset {
                None => 0,
                Some(offset) => {
                    utc_offset_s(offset.get_ref()).ok_or_else(|| {
                        at(offset.span(), &"utc_offset is +HH:MM, -HH:MM or Z")
                    })?
                }
            };
            Period::new(limit, unit, offset_s)
                .map(Rule::Period)
                .map_err(|e| {
                    let span = tier
                        .utc_offset
                        .as_ref()
                        .map_or(tier.limit.span(), Spanned::span);
                    at(span, &e)
                })
        }
    }
}

impl TiersBuilder {
    /// Adds the tiers (and default tier) of a TOML tiers file to these
    /// tiers; policies stay as set in code. Feature `tiers-toml`.
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
    /// A tier is a rate by default (`kind = "rate"`). It may instead be an
    /// exact window or a calendar period:
    ///
    /// ```toml
    /// [tiers.trial]
    /// kind = "window"              # at most `limit` in any window_secs
    /// limit = 5
    /// window_secs = 60
    /// [tiers.hobby]
    /// kind = "period"              # `limit` per calendar day, week or month
    /// limit = 1000
    /// per = "month"                # day | week (ISO, from Monday) | month
    /// utc_offset = "+05:30"        # optional, default "Z" (UTC)
    /// [tiers.batch]
    /// kind = "concurrency"         # at most `limit` requests in flight
    /// limit = 4
    /// ```
    ///
    /// Unknown fields, a field of another kind (`burst` on a window), a
    /// zero limit or burst, a window above
    /// [`MAX_WINDOW_LIMIT`](gcra_core::MAX_WINDOW_LIMIT), a bad tier name
    /// or a default tier that is not defined are errors that name the line.
    ///
    /// ```
    /// use tower_rate_tier::{OnMissing, Tiers, Quota};
    /// use http::StatusCode;
    ///
    /// let tiers = Tiers::builder()
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
    /// assert_eq!(tiers.quota("pro"), Some(Quota::per_minute(100).allow_burst(20)));
    ///
    /// let typo = Tiers::builder().from_toml("[tiers.free]\nlimit = 10\nper = \"minute\"\nbrust = 5\n");
    /// assert_eq!(typo.unwrap_err().line(), 4);
    ///
    /// use tower_rate_tier::{Period, PeriodUnit, rules::Rule};
    /// let monthly = Tiers::builder()
    ///     .from_toml("[tiers.hobby]\nkind = \"period\"\nlimit = 1000\nper = \"month\"\n")?
    ///     .build()?;
    /// assert_eq!(
    ///     monthly.rule("hobby"),
    ///     Some(Rule::Period(Period::new(1000, PeriodUnit::Month, 0)?))
    /// );
    /// let misplaced = Tiers::builder().from_toml(
    ///     "[tiers.trial]\nkind = \"window\"\nlimit = 5\nwindow_secs = 60\nburst = 2\n",
    /// );
    /// assert_eq!(misplaced.unwrap_err().to_string(), "line 5: a window has no burst");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "tiers-toml")))]
    pub fn from_toml(mut self, text: &str) -> Result<TiersBuilder, TiersError> {
        let file: File = toml::from_str(text)
            .map_err(|e| TiersError::at(text, e.span(), e.message()))?;
        for (name, tier) in &file.tiers {
            validate_tier_name(name.get_ref())
                .map_err(|e| TiersError::at(text, Some(name.span()), e))?;
            let rule = rule_of(text, tier.get_ref())?;
            self = self.tier(name.get_ref().clone(), rule);
        }
        if let Some(default) = &file.default_tier {
            if !file
                .tiers
                .keys()
                .any(|name| name.get_ref() == default.get_ref())
            {
                return Err(TiersError::at(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tiers;

    fn rule(toml: &str) -> Result<Option<Rule>, TiersError> {
        let tiers = Tiers::builder().from_toml(toml)?.build();
        Ok(tiers.ok().and_then(|tiers| tiers.rule("t")))
    }

    fn error(toml: &str) -> (usize, String) {
        let error = rule(toml).unwrap_err();
        (error.line(), error.message().to_owned())
    }

    #[test]
    fn each_kind_is_read_with_its_fields() {
        let window = rule(
            "[tiers.t]\nkind = \"window\"\nlimit = 5\nwindow_secs = 900\n",
        );
        assert_eq!(
            window.unwrap(),
            Some(Rule::Window(
                Window::new(5, Duration::from_secs(900)).unwrap()
            ))
        );
        let india = rule(
            "[tiers.t]\nkind = \"period\"\nlimit = 7\nper = \"week\"\nutc_offset = \"+05:30\"\n",
        );
        assert_eq!(
            india.unwrap(),
            Some(Rule::Period(
                Period::new(7, PeriodUnit::Week, 19_800).unwrap()
            ))
        );
        let west = rule(
            "[tiers.t]\nkind = \"period\"\nlimit = 7\nper = \"day\"\nutc_offset = \"-08:00\"\n",
        );
        assert_eq!(
            west.unwrap(),
            Some(Rule::Period(
                Period::new(7, PeriodUnit::Day, -28_800).unwrap()
            ))
        );
        let rate =
            rule("[tiers.t]\nkind = \"rate\"\nlimit = 10\nper = \"minute\"\n");
        assert_eq!(rate.unwrap(), Some(Rule::Rate(Quota::per_minute(10))));
    }

    #[test]
    fn a_kind_refuses_what_it_does_not_have_at_its_line() {
        let cases = [
            (
                "[tiers.t]\nkind = \"window\"\nlimit = 5\nper = \"minute\"\n",
                (4, "a window has no per: give window_secs"),
            ),
            (
                "[tiers.t]\nkind = \"window\"\nlimit = 5\n",
                (3, "a window needs window_secs"),
            ),
            (
                "[tiers.t]\nkind = \"window\"\nlimit = 5\nwindow_secs = 0\n",
                (4, "window_secs must be at least 1"),
            ),
            (
                "[tiers.t]\nkind = \"period\"\nlimit = 5\nper = \"hour\"\n",
                (4, "a period's per is day, week or month"),
            ),
            (
                "[tiers.t]\nkind = \"period\"\nlimit = 5\nper = \"day\"\nutc_offset = \"5:30\"\n",
                (5, "utc_offset is +HH:MM, -HH:MM or Z"),
            ),
            (
                "[tiers.t]\nkind = \"period\"\nlimit = 5\nper = \"day\"\nutc_offset = \"+19:00\"\n",
                (5, "period offset from UTC exceeds 18 hours"),
            ),
            (
                "[tiers.t]\nlimit = 5\nper = \"month\"\n",
                (
                    3,
                    "a rate's per is second, minute, hour or day: for a calendar week or month, kind = \"period\"",
                ),
            ),
            (
                "[tiers.t]\nlimit = 5\nper = \"day\"\nutc_offset = \"Z\"\n",
                (4, "a rate has no utc_offset"),
            ),
            ("[tiers.t]\nlimit = 5\n", (2, "a rate needs per")),
        ];
        for (toml, (line, message)) in cases {
            assert_eq!(error(toml), (line, message.to_owned()), "{toml}");
        }
        // Beyond the window's bound: the bound is said.
        let (line, message) = error(
            "[tiers.t]\nkind = \"window\"\nlimit = 2000\nwindow_secs = 60\n",
        );
        assert_eq!(line, 3);
        assert!(message.contains("1024"), "{message}");
        let slots = rule("[tiers.t]\nkind = \"concurrency\"\nlimit = 4\n");
        assert_eq!(
            slots.unwrap(),
            Some(Rule::Concurrency(Concurrency::new(4).unwrap()))
        );
        assert_eq!(
            error(
                "[tiers.t]\nkind = \"concurrency\"\nlimit = 4\nper = \"minute\"\n"
            ),
            (4, "a concurrency limit has no per".to_owned())
        );
        // An unknown kind names the ones there are.
        let (line, message) =
            error("[tiers.t]\nkind = \"semaphore\"\nlimit = 5\n");
        assert_eq!(line, 2);
        assert!(
            message.contains("rate") && message.contains("period"),
            "{message}"
        );
    }
}
