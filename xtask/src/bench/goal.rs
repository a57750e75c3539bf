//! A goal is data: one value both prints it in the table and decides
//! whether a figure meets it, so the two can never disagree.

use std::fmt;

/// How a figure is compared with a goal's bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cmp {
    AtMost,
    AtLeast,
    Below,
}

/// What a row aims at.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Goal {
    /// No goal: the row is shown for scale, with this note.
    Info(&'static str),
    /// The figure (the ratio, unless the row says otherwise) compared with
    /// `bound`; `what` names the figure when it is not the ratio, `unit`
    /// follows the bound.
    Bound {
        cmp: Cmp,
        bound: f64,
        what: &'static str,
        unit: &'static str,
    },
}

impl Goal {
    pub(crate) const fn at_most(bound: f64) -> Goal {
        Goal::Bound {
            cmp: Cmp::AtMost,
            bound,
            what: "",
            unit: "",
        }
    }

    pub(crate) const fn at_least(bound: f64) -> Goal {
        Goal::Bound {
            cmp: Cmp::AtLeast,
            bound,
            what: "",
            unit: "",
        }
    }

    pub(crate) const fn below(bound: f64) -> Goal {
        Goal::Bound {
            cmp: Cmp::Below,
            bound,
            what: "",
            unit: "",
        }
    }

    /// The same goal on a figure other than the ratio, named `what`, its
    /// bound shown with `unit`.
    pub(crate) const fn on(
        self,
        what: &'static str,
        unit: &'static str,
    ) -> Goal {
        match self {
            Goal::Bound { cmp, bound, .. } => Goal::Bound {
                cmp,
                bound,
                what,
                unit,
            },
            info @ Goal::Info(_) => info,
        }
    }

    /// Whether `value` meets it; `None` for a goal that is only a note.
    pub(crate) fn met(&self, value: f64) -> Option<bool> {
        match *self {
            Goal::Info(_) => None,
            Goal::Bound { cmp, bound, .. } => Some(match cmp {
                Cmp::AtMost => value <= bound,
                Cmp::AtLeast => value >= bound,
                Cmp::Below => value < bound,
            }),
        }
    }
}

impl fmt::Display for Goal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Goal::Info(note) => f.write_str(note),
            Goal::Bound {
                cmp,
                bound,
                what,
                unit,
            } => {
                let sign = match cmp {
                    Cmp::AtMost => "≤",
                    Cmp::AtLeast => "≥",
                    Cmp::Below => "<",
                };
                if !what.is_empty() {
                    write!(f, "{what} ")?;
                }
                write!(f, "{sign} {bound:?}{unit}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_and_the_decision_come_from_one_value() {
        let goal = Goal::at_most(1.0);
        assert_eq!(goal.to_string(), "≤ 1.0");
        assert_eq!(goal.met(1.0), Some(true));
        assert_eq!(goal.met(1.01), Some(false));

        let goal = Goal::below(5.0).on("added", " µs");
        assert_eq!(goal.to_string(), "added < 5.0 µs");
        assert_eq!(goal.met(4.9), Some(true));
        assert_eq!(goal.met(5.0), Some(false));

        let goal = Goal::at_least(0.95);
        assert_eq!(goal.to_string(), "≥ 0.95");
        assert_eq!(goal.met(0.95), Some(true));

        assert_eq!(Goal::Info("(info)").met(3.0), None);
        assert_eq!(Goal::Info("(info)").to_string(), "(info)");
    }
}
