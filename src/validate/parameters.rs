//! The rules of a parameter's value that validation and the Parameter plugin share: which values a
//! declared type takes, and which option of an enumeration a choice names. One place, so that
//! `validate` (and so the runner, which validates first) and the plugin never disagree.

use crate::messages::v1::{EnumOption, ParameterDefinition, ParameterType, parameter_value::Value};

/// Whether a value of this variant can stand for a parameter of type `declared`: its own variant, and
/// the original's leniencies (text for a textarea and back, an integer for a floating point number, an
/// enumeration's choice given as text): exactly the pairs the Parameter plugin turns into an argument
/// (its `argument`), so that validation (and so the runner, which
/// validates first) takes nothing the plugin refuses.
pub fn accepts(declared: ParameterType, value: &Value) -> bool {
    use ParameterType as T;
    matches!(
        (declared, value),
        (T::Text | T::Textarea, Value::Text(_) | Value::Textarea(_))
            | (T::Integer, Value::Integer(_))
            | (
                T::FloatingPoint,
                Value::FloatingPoint(_) | Value::Integer(_)
            )
            | (T::Boolean, Value::Boolean(_))
            | (T::Enumeration, Value::Enumeration(_) | Value::Text(_))
            | (T::InputFile | T::InputDirectory, Value::File(_))
            | (T::Peer, Value::Peer(_))
            | (T::LicenseServer, Value::LicenseServer(_))
            | (T::Ingress, Value::Ingress(_))
            | (T::NetworkIp, Value::NetworkIp(_))
    )
}

/// The option of an enumeration that `choice` names: by its name, else by its value, as the original
/// took it (`-O3` for the option `O3` whose value is `-O3`).
pub fn option<'a>(definition: &'a ParameterDefinition, choice: &str) -> Option<&'a EnumOption> {
    definition
        .options
        .iter()
        .find(|o| o.name == choice)
        .or_else(|| definition.options.iter().find(|o| o.value == choice))
}
