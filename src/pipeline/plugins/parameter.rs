//! Parameter: the application's invocation template becomes the container's `command` (a plain argv that
//! replaces the image ENTRYPOINT; no shell, nothing escaped), and its environment templates become `env`.
//!
//! # The template language
//! - `word`: the word.
//! - `var {variableNames, prefixGlobal, suffixGlobal, prefixVariable, suffixVariable, is*PartOfArg}`:
//!   affixes are trimmed. When none of the variables has a value: nothing, not even the global affixes.
//!   Otherwise: `prefixGlobal` (when not blank); then per variable with a value, in order, the prefix as
//!   its own argument (when not blank) or glued in front of the value, the value, and the suffix as its own
//!   argument (when not blank) or glued after the value; finally `suffixGlobal` (when not blank).
//! - `bool_flag {variableName, flag}`: the trimmed flag when the boolean is true (one argument even with
//!   spaces); nothing when false, absent or the flag is blank; an error when the value is not a boolean.
//! - `env {variable}`: `$(VARIABLE)` in the environment context; nothing in the command context.
//!
//! # Values as arguments
//! text and textarea as given; integers in decimal; floating point numbers in plain decimal, never in
//! exponent notation, always with a fraction (`1.0`); booleans as the parameter's `trueValue`/`falseValue`
//! when set, else `true`/`false` (W23: UCloud ignored them after 2020); enumerations map the chosen
//! option's name to its value; input files and folders as their mount point (see FileMount); peers as their
//! hostname; license servers as `address:port/license` (or `address:port`) from the configuration's table;
//! public links and IPs as their id.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::EnvVar;

use super::{Plugin, PluginId};
use crate::messages::v1::{
    InvocationParameter, ParameterDefinition, ParameterType, ParameterValue, VariableInvocation,
    invocation_parameter::Kind, parameter_value::Value,
};
use crate::pipeline::LicenseServer;
use crate::pipeline::PipelineError;
use crate::pipeline::context::Context;
use crate::pipeline::draft::Draft;
use crate::pipeline::mounts::MountPlan;
use crate::validate::parameters::option;

/// The environment variable that tells an interactive application which file to open.
pub const OPEN_WITH_FILE_ENV: &str = "UCLOUD_OPEN_WITH_FILE";

/// The Parameter plugin; the module documentation says what it builds and why.
pub struct Parameter;

impl Plugin for Parameter {
    fn id(&self) -> PluginId {
        PluginId::Parameter
    }

    fn build(&self, cx: &Context<'_>, draft: &mut Draft) -> Result<(), PipelineError> {
        let values = JobArguments {
            definitions: &cx.app.parameters,
            values: &cx.job.parameters,
            licenses: cx.settings.licenses,
            mounts: &cx.mounts,
        };
        let mut command = Vec::new();
        for (i, element) in cx.app.invocation.iter().enumerate() {
            command
                .extend(expand(element, Target::Command, &values).map_err(|e| e.at_invocation(i))?);
        }
        draft.user.command = Some(command);

        let mut env = Vec::with_capacity(cx.app.environment.len() + 1);
        for (name, template) in &cx.app.environment {
            if !is_env_name(name) {
                return Err(PipelineError::invalid(
                    format!("application.environment.{name}"),
                    "is not a valid environment variable name",
                ));
            }
            let parts = expand(template, Target::Environment, &values)
                .map_err(|e| e.in_environment(name))?;
            if !parts.is_empty() {
                env.push(EnvVar {
                    name: name.clone(),
                    value: Some(parts.join(" ")),
                    value_from: None,
                });
            }
        }
        if let Some(file) = cx.job.opened_file.as_deref() {
            let path = cx.mounts.translate(file).ok_or_else(|| {
                PipelineError::invalid("openedFile", "is not inside any folder the job mounts")
            })?;
            env.retain(|e| e.name != OPEN_WITH_FILE_ENV);
            env.push(EnvVar {
                name: OPEN_WITH_FILE_ENV.to_owned(),
                value: Some(escape_dollars(&path)),
                value_from: None,
            });
        }
        draft.user.env = (!env.is_empty()).then_some(env);
        Ok(())
    }
}

/// Which list a template builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The argv.
    Command,
    /// One environment variable's value (joined with spaces).
    Environment,
}

/// Why a template could not be expanded. Turned into a [`PipelineError`] with the field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateError {
    /// A parameter's value is wrong; `name` is the parameter.
    Parameter {
        /// The parameter.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// The template element itself is wrong.
    Template {
        /// What is wrong.
        message: String,
    },
}

impl TemplateError {
    fn param(name: &str, message: impl Into<String>) -> Self {
        Self::Parameter {
            name: name.to_owned(),
            message: message.into(),
        }
    }

    fn at_invocation(self, index: usize) -> PipelineError {
        match self {
            Self::Parameter { name, message } => {
                PipelineError::invalid(format!("parameters.{name}"), message)
            }
            Self::Template { message } => {
                PipelineError::invalid(format!("application.invocation[{index}]"), message)
            }
        }
    }

    fn in_environment(self, variable: &str) -> PipelineError {
        match self {
            Self::Parameter { name, message } => {
                PipelineError::invalid(format!("parameters.{name}"), message)
            }
            Self::Template { message } => {
                PipelineError::invalid(format!("application.environment.{variable}"), message)
            }
        }
    }
}

/// Where the template language gets variable values from.
pub trait Arguments {
    /// The argument for a variable, `None` when it has no value.
    fn argument(&self, name: &str) -> Result<Option<String>, TemplateError>;
    /// The boolean value of a variable, `None` when it has no value; an error when it is not a boolean.
    fn boolean(&self, name: &str) -> Result<Option<bool>, TemplateError>;
}

/// Expands one template element. Never panics, whatever the input.
pub fn expand(
    element: &InvocationParameter,
    target: Target,
    args: &impl Arguments,
) -> Result<Vec<String>, TemplateError> {
    match &element.kind {
        Some(Kind::Word(word)) => Ok(vec![word.word.clone()]),
        Some(Kind::Var(var)) => expand_var(var, args),
        Some(Kind::BoolFlag(flag)) => match args.boolean(&flag.variable_name)? {
            Some(true) if !flag.flag.trim().is_empty() => Ok(vec![flag.flag.trim().to_owned()]),
            _ => Ok(Vec::new()),
        },
        Some(Kind::Env(env)) => Ok(match target {
            Target::Environment => vec![format!("$({})", env.variable)],
            Target::Command => Vec::new(),
        }),
        None => Err(TemplateError::Template {
            message: "has no kind".into(),
        }),
    }
}

fn expand_var(
    var: &VariableInvocation,
    args: &impl Arguments,
) -> Result<Vec<String>, TemplateError> {
    let mut values = Vec::with_capacity(var.variable_names.len());
    for name in &var.variable_names {
        if let Some(value) = args.argument(name)? {
            values.push(value);
        }
    }
    if values.is_empty() {
        return Ok(Vec::new());
    }
    let (prefix_global, suffix_global) = (var.prefix_global.trim(), var.suffix_global.trim());
    let (prefix, suffix) = (var.prefix_variable.trim(), var.suffix_variable.trim());
    let mut out = Vec::with_capacity(values.len() * 3 + 2);
    if !prefix_global.is_empty() {
        out.push(prefix_global.to_owned());
    }
    for value in values {
        let mut arg = if var.is_prefix_variable_part_of_arg {
            format!("{prefix}{value}")
        } else {
            if !prefix.is_empty() {
                out.push(prefix.to_owned());
            }
            value
        };
        if var.is_suffix_variable_part_of_arg {
            arg.push_str(suffix);
            out.push(arg);
        } else {
            out.push(arg);
            if !suffix.is_empty() {
                out.push(suffix.to_owned());
            }
        }
    }
    if !suffix_global.is_empty() {
        out.push(suffix_global.to_owned());
    }
    Ok(out)
}

/// The values of one job, resolved against the application's definitions.
pub struct JobArguments<'a> {
    /// The application's parameter definitions.
    pub definitions: &'a [ParameterDefinition],
    /// The job's values by parameter name.
    pub values: &'a BTreeMap<String, ParameterValue>,
    /// The license table of the configuration.
    pub licenses: &'a BTreeMap<String, LicenseServer>,
    /// Where files are mounted.
    pub mounts: &'a MountPlan,
}

impl JobArguments<'_> {
    fn value(&self, name: &str) -> Result<Option<(&ParameterDefinition, &Value)>, TemplateError> {
        let Some(value) = self.values.get(name) else {
            return Ok(None);
        };
        let Some(value) = &value.value else {
            return Err(TemplateError::param(name, "has no value"));
        };
        let definition = self
            .definitions
            .iter()
            .find(|d| d.name == name)
            .ok_or_else(|| {
                TemplateError::param(name, "the application has no parameter with this name")
            })?;
        Ok(Some((definition, value)))
    }
}

impl Arguments for JobArguments<'_> {
    fn argument(&self, name: &str) -> Result<Option<String>, TemplateError> {
        let Some((definition, value)) = self.value(name)? else {
            return Ok(None);
        };
        argument(name, definition, value, self.licenses, self.mounts)
            .map(|a| Some(escape_dollars(&a)))
    }

    fn boolean(&self, name: &str) -> Result<Option<bool>, TemplateError> {
        match self.value(name)? {
            None => Ok(None),
            Some((_, Value::Boolean(b))) => Ok(Some(*b)),
            Some(_) => Err(TemplateError::param(
                name,
                "is used as a flag but is not a boolean",
            )),
        }
    }
}

/// The argument a value becomes, by the parameter's declared type.
pub fn argument(
    name: &str,
    definition: &ParameterDefinition,
    value: &Value,
    licenses: &BTreeMap<String, LicenseServer>,
    mounts: &MountPlan,
) -> Result<String, TemplateError> {
    let declared = ParameterType::try_from(definition.r#type).unwrap_or(ParameterType::Unspecified);
    let mismatch = || {
        TemplateError::param(
            name,
            format!(
                "a {} parameter cannot take a {} value",
                type_name(declared),
                value_name(value)
            ),
        )
    };
    match (declared, value) {
        (ParameterType::Text | ParameterType::Textarea, Value::Text(s) | Value::Textarea(s)) => {
            Ok(s.clone())
        }
        (ParameterType::Integer, Value::Integer(i)) => Ok(i.to_string()),
        (ParameterType::FloatingPoint, Value::FloatingPoint(f)) => {
            format_float(*f).ok_or_else(|| TemplateError::param(name, "must be a finite number"))
        }
        (ParameterType::FloatingPoint, Value::Integer(i)) => Ok(format!("{i}.0")),
        (ParameterType::Boolean, Value::Boolean(b)) => Ok(match b {
            true => definition
                .true_value
                .clone()
                .unwrap_or_else(|| "true".into()),
            false => definition
                .false_value
                .clone()
                .unwrap_or_else(|| "false".into()),
        }),
        (ParameterType::Enumeration, Value::Enumeration(choice) | Value::Text(choice)) => {
            option(definition, choice)
                .map(|o| o.value.clone())
                .ok_or_else(|| {
                    TemplateError::param(name, format!("`{choice}` is not one of the options"))
                })
        }
        (ParameterType::InputFile | ParameterType::InputDirectory, Value::File(file)) => mounts
            .mount_point(&file.path)
            .map(str::to_owned)
            .ok_or_else(|| TemplateError::param(name, "the file is not mounted")),
        (ParameterType::Peer, Value::Peer(peer)) => Ok(peer.hostname.clone()),
        (ParameterType::LicenseServer, Value::LicenseServer(license)) => licenses
            .get(&license.id)
            .map(|server| match &server.license {
                Some(key) => format!("{}:{}/{}", server.address, server.port, key.expose()),
                None => format!("{}:{}", server.address, server.port),
            })
            .ok_or_else(|| {
                TemplateError::param(
                    name,
                    format!("Invalid license passed for parameter: {name}"),
                )
            }),
        (ParameterType::Ingress, Value::Ingress(ingress)) => Ok(ingress.id.clone()),
        (ParameterType::NetworkIp, Value::NetworkIp(ip)) => Ok(ip.id.clone()),
        (ParameterType::Unspecified, _) => {
            Err(TemplateError::param(name, "the parameter has no type"))
        }
        _ => Err(mismatch()),
    }
}

/// A float in plain decimal with a fraction: `0.5`, `1.0`, `10000000000.0`; `None` for NaN and infinities.
pub fn format_float(value: f64) -> Option<String> {
    if !value.is_finite() {
        return None;
    }
    // Rust's Display for f64 is the shortest round-trip form and never uses exponent notation.
    let mut text = value.to_string();
    if !text.contains('.') {
        text.push_str(".0");
    }
    Some(text)
}

/// Kubernetes expands `$(VAR)` in `command` and `env` values and turns `$$` into `$`. Values come from
/// users and must reach the program exactly as typed, so every `$` in them is doubled. (Template words and
/// affixes are the application author's and are left alone, so `$(VAR)` there still expands.)
pub fn escape_dollars(value: &str) -> String {
    if value.contains('$') {
        value.replace('$', "$$")
    } else {
        value.to_owned()
    }
}

/// A conservative environment variable name: `[A-Za-z_.-][A-Za-z0-9_.-]*`.
pub fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || matches!(c, '_' | '.' | '-'))
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn type_name(t: ParameterType) -> &'static str {
    match t {
        ParameterType::Unspecified => "untyped",
        ParameterType::Text => "text",
        ParameterType::Textarea => "textarea",
        ParameterType::Integer => "integer",
        ParameterType::FloatingPoint => "floating point",
        ParameterType::Boolean => "boolean",
        ParameterType::Enumeration => "enumeration",
        ParameterType::InputFile => "input file",
        ParameterType::InputDirectory => "input directory",
        ParameterType::Peer => "peer",
        ParameterType::LicenseServer => "license server",
        ParameterType::Ingress => "public link",
        ParameterType::NetworkIp => "public IP",
    }
}

fn value_name(v: &Value) -> &'static str {
    match v {
        Value::Text(_) => "text",
        Value::Textarea(_) => "textarea",
        Value::Integer(_) => "integer",
        Value::FloatingPoint(_) => "floating point",
        Value::Boolean(_) => "boolean",
        Value::Enumeration(_) => "enumeration",
        Value::File(_) => "file",
        Value::Peer(_) => "peer",
        Value::LicenseServer(_) => "license server",
        Value::Ingress(_) => "public link",
        Value::NetworkIp(_) => "public IP",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::v1::{
        BooleanFlagInvocation, EnvironmentVariableInvocation, WordInvocation,
    };

    /// Values for tests: text by name, booleans by name.
    #[derive(Default)]
    struct Map(BTreeMap<String, String>, BTreeMap<String, bool>);

    impl Arguments for Map {
        fn argument(&self, name: &str) -> Result<Option<String>, TemplateError> {
            Ok(self
                .0
                .get(name)
                .cloned()
                .or_else(|| self.1.get(name).map(|b| b.to_string())))
        }
        fn boolean(&self, name: &str) -> Result<Option<bool>, TemplateError> {
            match (self.1.get(name), self.0.contains_key(name)) {
                (Some(b), _) => Ok(Some(*b)),
                (None, true) => Err(TemplateError::param(name, "not a boolean")),
                (None, false) => Ok(None),
            }
        }
    }

    fn var(names: &[&str]) -> VariableInvocation {
        VariableInvocation {
            variable_names: names.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn el(kind: Kind) -> InvocationParameter {
        InvocationParameter { kind: Some(kind) }
    }

    #[test]
    fn worked_affix_example_from_the_ucloud_docs() {
        let mut v = var(&["a", "b"]);
        v.prefix_global = "--entries".into();
        v.prefix_variable = "--entry".into();
        v.suffix_variable = "--next".into();
        v.suffix_global = "--endOfEntries".into();
        v.is_suffix_variable_part_of_arg = true;
        let args = Map(
            [("a".into(), "42".into()), ("b".into(), "hello".into())].into(),
            Default::default(),
        );
        let out = expand(&el(Kind::Var(v.clone())), Target::Command, &args).unwrap();
        assert_eq!(
            out,
            [
                "--entries",
                "--entry",
                "42--next",
                "--entry",
                "hello--next",
                "--endOfEntries"
            ]
        );
        assert!(
            expand(&el(Kind::Var(v)), Target::Command, &Map::default())
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn glued_prefix_and_blank_affixes() {
        let mut v = var(&["a"]);
        v.prefix_variable = " -n".into();
        v.is_prefix_variable_part_of_arg = true;
        v.suffix_variable = "   ".into();
        let args = Map([("a".into(), "4".into())].into(), Default::default());
        assert_eq!(
            expand(&el(Kind::Var(v)), Target::Command, &args).unwrap(),
            ["-n4"]
        );
    }

    #[test]
    fn flags_and_env() {
        let flag = el(Kind::BoolFlag(BooleanFlagInvocation {
            variable_name: "v".into(),
            flag: " --verbose ".into(),
        }));
        let yes = Map(Default::default(), [("v".into(), true)].into());
        let no = Map(Default::default(), [("v".into(), false)].into());
        let text = Map([("v".into(), "yes".into())].into(), Default::default());
        assert_eq!(expand(&flag, Target::Command, &yes).unwrap(), ["--verbose"]);
        assert!(expand(&flag, Target::Command, &no).unwrap().is_empty());
        assert!(
            expand(&flag, Target::Command, &Map::default())
                .unwrap()
                .is_empty()
        );
        assert!(expand(&flag, Target::Command, &text).is_err());
        let env = el(Kind::Env(EnvironmentVariableInvocation {
            variable: "HOME".into(),
        }));
        assert_eq!(
            expand(&env, Target::Environment, &Map::default()).unwrap(),
            ["$(HOME)"]
        );
        assert!(
            expand(&env, Target::Command, &Map::default())
                .unwrap()
                .is_empty()
        );
        let word = el(Kind::Word(WordInvocation {
            word: "figlet".into(),
        }));
        assert_eq!(
            expand(&word, Target::Command, &Map::default()).unwrap(),
            ["figlet"]
        );
        assert!(
            expand(
                &InvocationParameter { kind: None },
                Target::Command,
                &Map::default()
            )
            .is_err()
        );
    }

    #[test]
    fn floats_never_use_exponents() {
        assert_eq!(format_float(0.5).unwrap(), "0.5");
        assert_eq!(format_float(1.0).unwrap(), "1.0");
        assert_eq!(format_float(1e10).unwrap(), "10000000000.0");
        assert_eq!(format_float(1.5e-7).unwrap(), "0.00000015");
        assert_eq!(format_float(-2.25).unwrap(), "-2.25");
        assert!(format_float(f64::NAN).is_none());
        assert!(format_float(f64::INFINITY).is_none());
    }

    #[test]
    fn dollars_in_values_are_escaped_for_kubernetes() {
        assert_eq!(escape_dollars("$(HOME) costs $5"), "$$(HOME) costs $$5");
        assert_eq!(escape_dollars("plain"), "plain");
    }

    #[test]
    fn env_names() {
        assert!(
            is_env_name("GREETING")
                && is_env_name("_x.y-z")
                && !is_env_name("1A")
                && !is_env_name("A=B")
        );
        assert!(!is_env_name(""));
    }
}
