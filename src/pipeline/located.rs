//! Where a value derived from a submission came from (`resources[2]`, `parameters.db`): errors about it
//! name that place. Below the context and the mount plan, which both carry located values.

/// Where in the SubmitJob a derived value came from, to name it in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin<'a> {
    /// `resources[i]`.
    Resource(usize),
    /// `parameters.<name>`.
    Parameter(&'a str),
}

impl Origin<'_> {
    /// The JSON path of the value of `kind` (`peer`, `file`, `ingress`, `networkIp`), as validation
    /// names it: `resources[2].peer` or `parameters.db.peer`.
    pub fn field(&self, kind: &str) -> String {
        match self {
            Self::Resource(i) => format!("resources[{i}].{kind}"),
            Self::Parameter(name) => format!("parameters.{name}.{kind}"),
        }
    }
}

/// A value with where it came from.
#[derive(Debug, Clone, Copy)]
pub struct Located<'a, T> {
    /// Where it came from.
    pub origin: Origin<'a>,
    /// The value.
    pub value: &'a T,
}
