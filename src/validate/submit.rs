//! The rules for `SubmitJob` (listed in the module documentation of [`crate::validate`]).

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::Rules;
use super::{
    ErrorKind, ValidationError, image, job_id_at, names, quoted, time_allocation, timestamp,
};
use crate::messages::v1::{
    Application, ApplicationType, FileValue, IngressValue, InvocationParameter, LicenseServerValue,
    NetworkIpValue, Owner, ParameterDefinition, ParameterType, PeerValue, Product, Protocol,
    SubmitJob, invocation_parameter, parameter_value, resource_value,
};

type Check<T = ()> = Result<T, ValidationError>;

/// The longest path accepted for a file, folder or output folder.
const PATH_MAX: usize = 4096;
/// The longest job name, as UCloud allows.
const JOB_NAME_MAX: usize = 200;

/// The reference's messages for public links and IPs on multi-node jobs.
const INGRESS_MULTI_REPLICA: &str =
    "UCloud/compute does not currently support ingress with multiple replicas";
const NETWORK_IP_MULTI_REPLICA: &str =
    "UCloud/compute does not currently support IPs with multiple nodes";

pub(super) fn check(job: &SubmitJob, config: &Rules<'_>) -> Check {
    job_id_at("jobId", &job.job_id)?;
    // Every string within its bound (the JSON Schema's maxLength). A message that has no JSON form (an
    // enum number or a time outside the contract) is refused below for that, naming the field.
    if let Ok(json) = serde_json::to_value(job) {
        super::text::check(&json, super::text::submit_limit)?;
    }
    owner(job.owner.as_ref())?;
    if let Some(name) = &job.job_name {
        job_name(name)?;
    }
    replicas(job, config)?;
    whole_nodes_need_a_time_limit(job)?;
    product(job.product.as_ref())?;
    let app = job
        .application
        .as_ref()
        .ok_or_else(|| ValidationError::missing("application"))?;
    let definitions = application(app)?;
    if let Some(d) = &job.time_allocation {
        time_allocation("timeAllocation", d)?;
    }
    if let Some(t) = &job.submitted_at {
        timestamp("submittedAt", t)?;
    }
    start_window(job)?;

    let values = Values { config };
    for (name, value) in &job.parameters {
        let field = format!("parameters.{name}");
        let definition = definitions.get(name.as_str()).ok_or_else(|| {
            ValidationError::new(
                ErrorKind::UnknownParameter,
                &field,
                format!(
                    "the application declares no parameter named {}",
                    quoted(name)
                ),
            )
        })?;
        let value = value.value.as_ref().ok_or_else(|| {
            ValidationError::new(
                ErrorKind::Missing,
                &field,
                "the value is empty: set the one member that matches the parameter's type",
            )
        })?;
        values.parameter(&field, definition, value)?;
    }
    for definition in &app.parameters {
        if !definition.optional && !job.parameters.contains_key(&definition.name) {
            return Err(ValidationError::new(
                ErrorKind::Missing,
                format!("parameters.{}", definition.name),
                format!(
                    "the application requires a value for {} ({})",
                    quoted(&definition.name),
                    type_name(parameter_type(definition))
                ),
            ));
        }
    }
    for (i, resource) in job.resources.iter().enumerate() {
        let field = format!("resources[{i}]");
        match &resource.value {
            None => {
                return Err(ValidationError::invalid(
                    field,
                    "empty resource: set one of file, peer, ingress, networkIp",
                ));
            }
            Some(resource_value::Value::File(f)) => file(&field, f)?,
            Some(resource_value::Value::Peer(p)) => peer(&field, p)?,
            Some(resource_value::Value::Ingress(i)) => ingress(&field, i)?,
            Some(resource_value::Value::NetworkIp(n)) => network_ip(&field, n)?,
        }
    }
    if let Some(path) = &job.output_folder {
        storage_path("outputFolder", path)?;
    }
    if let Some(path) = &job.opened_file {
        storage_path("openedFile", path)?;
        opened_file_is_mounted(job, path)?;
    }
    distinct_peers(job)?;
    single_replica_resources(job)
}

fn owner(owner: Option<&Owner>) -> Check {
    let owner = owner.ok_or_else(|| ValidationError::missing("owner"))?;
    non_empty("owner.user", &owner.user)?;
    if owner.project.as_deref() == Some("") {
        return Err(ValidationError::invalid(
            "owner.project",
            "empty: leave it out when the job does not run in a project",
        ));
    }
    Ok(())
}

fn job_name(name: &str) -> Check {
    if name.chars().count() > JOB_NAME_MAX || name.chars().any(char::is_control) {
        return Err(ValidationError::invalid(
            "jobName",
            format!("at most {JOB_NAME_MAX} characters and no control characters"),
        ));
    }
    Ok(())
}

fn replicas(job: &SubmitJob, config: &Rules<'_>) -> Check {
    let max = config.max_replicas;
    if job.replicas == 0 {
        return Err(ValidationError::invalid("replicas", "must be at least 1"));
    }
    if job.replicas > max {
        return Err(ValidationError::new(
            ErrorKind::LimitExceeded,
            "replicas",
            format!(
                "{} replicas asked for, at most {max} are allowed (limits.max_replicas)",
                job.replicas
            ),
        ));
    }
    // Volcano's svc plugin makes each pod name the pod's host name, which must be a DNS label too.
    let last_host = format!("j-{}-job-{}", job.job_id, job.replicas - 1);
    if last_host.len() > names::DNS_LABEL_MAX {
        return Err(ValidationError::invalid(
            "jobId",
            format!(
                "job id too long for {} replicas: the pod host name {last_host} would have {} \
                 characters, at most {} are allowed",
                job.replicas,
                last_host.len(),
                names::DNS_LABEL_MAX
            ),
        ));
    }
    Ok(())
}

/// A whole-node job keeps every other job off its nodes while it runs: without a time limit it would hold
/// them forever.
fn whole_nodes_need_a_time_limit(job: &SubmitJob) -> Check {
    if job.exclusive_nodes && job.time_allocation.is_none() {
        return Err(ValidationError::new(
            ErrorKind::Missing,
            "timeAllocation",
            "a whole-node job (exclusiveNodes) needs a time limit: without one it would hold its nodes forever",
        ));
    }
    Ok(())
}

/// A booked start sets capacity aside for `[start, start + timeAllocation)`: without a time limit there is
/// no end to set it aside until, and a window that ends before it begins cannot be met. Whether the window
/// lies in the past or too far ahead is the booking's answer (refused, with the earliest window), not a
/// rule of the message: it depends on the clock, which validation does not read.
fn start_window(job: &SubmitJob) -> Check {
    let Some(window) = &job.start_window else {
        return Ok(());
    };
    let earliest = window
        .earliest
        .as_ref()
        .ok_or_else(|| ValidationError::missing("startWindow.earliest"))?;
    let latest = window
        .latest
        .as_ref()
        .ok_or_else(|| ValidationError::missing("startWindow.latest"))?;
    timestamp("startWindow.earliest", earliest)?;
    timestamp("startWindow.latest", latest)?;
    if (latest.seconds, latest.nanos) < (earliest.seconds, earliest.nanos) {
        return Err(ValidationError::invalid(
            "startWindow.latest",
            "the latest start is before the earliest: the window must be earliest <= latest",
        ));
    }
    if job.exclusive_nodes {
        return Err(ValidationError::invalid(
            "startWindow",
            "whole-node jobs (exclusiveNodes) cannot be booked: book the ranks by their product instead",
        ));
    }
    if job.time_allocation.is_none() {
        return Err(ValidationError::new(
            ErrorKind::Missing,
            "timeAllocation",
            "a booked start (startWindow) needs a time limit: the capacity is set aside from the start \
             until the allocation ends, and without one it would be set aside forever",
        ));
    }
    Ok(())
}

fn product(product: Option<&Product>) -> Check {
    let product = product.ok_or_else(|| ValidationError::missing("product"))?;
    non_empty("product.id", &product.id)?;
    non_empty("product.category", &product.category)?;
    if product.cpu == 0 {
        return Err(ValidationError::invalid(
            "product.cpu",
            "must be at least 1 vCPU: a pod without a CPU request is BestEffort and cannot be charged",
        ));
    }
    if product.memory_gib == 0 {
        return Err(ValidationError::invalid(
            "product.memoryGib",
            "must be at least 1 GiB: a pod without a memory request is BestEffort and cannot be charged",
        ));
    }
    Ok(())
}

/// Checks the application and returns its parameter definitions by name.
fn application(app: &Application) -> Check<BTreeMap<&str, &ParameterDefinition>> {
    non_empty("application.name", &app.name)?;
    non_empty("application.version", &app.version)?;
    non_empty("application.image", &app.image)?;
    image::parse(&app.image).map_err(|e| {
        ValidationError::invalid(
            "application.image",
            format!("malformed image reference {}: {e}", quoted(&app.image)),
        )
    })?;
    match ApplicationType::try_from(app.application_type) {
        Ok(ApplicationType::Unspecified) => {
            return Err(ValidationError::new(
                ErrorKind::Missing,
                "application.applicationType",
                "required: one of APPLICATION_TYPE_BATCH, APPLICATION_TYPE_WEB, \
                 APPLICATION_TYPE_VNC, APPLICATION_TYPE_TERMINAL",
            ));
        }
        Ok(ApplicationType::Web) if app.web_port.is_none() => {
            return Err(ValidationError::new(
                ErrorKind::Missing,
                "application.webPort",
                "required for a WEB application: the proxy needs the port of its web interface",
            ));
        }
        Ok(ApplicationType::Vnc) if app.vnc_port.is_none() => {
            return Err(ValidationError::new(
                ErrorKind::Missing,
                "application.vncPort",
                "required for a VNC application: the proxy needs the port of its VNC server",
            ));
        }
        Ok(_) => {}
        Err(_) => {
            return Err(ValidationError::invalid(
                "application.applicationType",
                format!("unknown application type {}", app.application_type),
            ));
        }
    }
    if let Some(p) = app.web_port {
        port("application.webPort", p)?;
    }
    if let Some(p) = app.vnc_port {
        port("application.vncPort", p)?;
    }

    let mut definitions = BTreeMap::new();
    for (i, definition) in app.parameters.iter().enumerate() {
        let field = format!("application.parameters[{i}]");
        parameter_definition(&field, definition)?;
        if definitions
            .insert(definition.name.as_str(), definition)
            .is_some()
        {
            return Err(ValidationError::invalid(
                format!("{field}.name"),
                format!("duplicate parameter name {}", quoted(&definition.name)),
            ));
        }
    }

    for (i, element) in app.invocation.iter().enumerate() {
        template(
            &format!("application.invocation[{i}]"),
            element,
            &definitions,
        )?;
    }
    for (name, element) in &app.environment {
        let field = format!("application.environment.{name}");
        if !names::is_env_var_name(name) {
            return Err(ValidationError::invalid(
                field,
                format!(
                    "invalid environment variable name {}: letters, digits, '_', '-' or '.', not \
                     starting with a digit",
                    quoted(name)
                ),
            ));
        }
        template(&field, element, &definitions)?;
    }
    Ok(definitions)
}

fn parameter_definition(field: &str, definition: &ParameterDefinition) -> Check {
    non_empty(&format!("{field}.name"), &definition.name)?;
    let kind = match ParameterType::try_from(definition.r#type) {
        Ok(ParameterType::Unspecified) => {
            return Err(ValidationError::missing(format!("{field}.type")));
        }
        Ok(kind) => kind,
        Err(_) => {
            return Err(ValidationError::invalid(
                format!("{field}.type"),
                format!("unknown parameter type {}", definition.r#type),
            ));
        }
    };
    for (key, bound) in [("min", definition.min), ("max", definition.max)] {
        if let Some(b) = bound.filter(|b| !b.is_finite()) {
            return Err(ValidationError::invalid(
                format!("{field}.{key}"),
                format!("must be a finite number, got {b}"),
            ));
        }
    }
    if let (Some(min), Some(max)) = (definition.min, definition.max)
        && min > max
    {
        return Err(ValidationError::invalid(
            format!("{field}.min"),
            format!("min {} is greater than max {}", number(min), number(max)),
        ));
    }
    if kind == ParameterType::Enumeration {
        if definition.options.is_empty() {
            return Err(ValidationError::invalid(
                format!("{field}.options"),
                "an enumeration needs at least one option",
            ));
        }
        for (j, option) in definition.options.iter().enumerate() {
            let option_field = format!("{field}.options[{j}].name");
            non_empty(&option_field, &option.name)?;
            if definition.options[..j]
                .iter()
                .any(|o| o.name == option.name)
            {
                return Err(ValidationError::invalid(
                    option_field,
                    format!("duplicate option name {}", quoted(&option.name)),
                ));
            }
        }
    }
    Ok(())
}

/// One element of the invocation or environment template language.
fn template(
    field: &str,
    element: &InvocationParameter,
    definitions: &BTreeMap<&str, &ParameterDefinition>,
) -> Check {
    use invocation_parameter::Kind;
    match &element.kind {
        None => Err(ValidationError::invalid(
            field,
            "empty template element: set one of word, var, boolFlag, env",
        )),
        Some(Kind::Word(_)) => Ok(()),
        Some(Kind::Var(var)) => {
            if var.variable_names.is_empty() {
                return Err(ValidationError::missing(format!(
                    "{field}.var.variableNames"
                )));
            }
            for (j, name) in var.variable_names.iter().enumerate() {
                declared(
                    &format!("{field}.var.variableNames[{j}]"),
                    name,
                    definitions,
                )?;
            }
            Ok(())
        }
        Some(Kind::BoolFlag(flag)) => {
            let name_field = format!("{field}.boolFlag.variableName");
            let definition = declared(&name_field, &flag.variable_name, definitions)?;
            let kind = parameter_type(definition);
            if kind != ParameterType::Boolean {
                return Err(ValidationError::new(
                    ErrorKind::WrongParameterType,
                    name_field,
                    format!(
                        "boolFlag needs a boolean parameter, but {} is {}",
                        quoted(&flag.variable_name),
                        type_name(kind)
                    ),
                ));
            }
            non_empty(&format!("{field}.boolFlag.flag"), flag.flag.trim())
        }
        Some(Kind::Env(env)) => {
            if !names::is_env_var_name(&env.variable) {
                return Err(ValidationError::invalid(
                    format!("{field}.env.variable"),
                    format!(
                        "invalid environment variable name {}",
                        quoted(&env.variable)
                    ),
                ));
            }
            Ok(())
        }
    }
}

fn declared<'a>(
    field: &str,
    name: &str,
    definitions: &BTreeMap<&str, &'a ParameterDefinition>,
) -> Check<&'a ParameterDefinition> {
    non_empty(field, name)?;
    definitions.get(name).copied().ok_or_else(|| {
        ValidationError::new(
            ErrorKind::UnknownParameter,
            field,
            format!(
                "the template uses parameter {}, which the application does not declare",
                quoted(name)
            ),
        )
    })
}

/// What parameter values are checked against.
struct Values<'a> {
    config: &'a Rules<'a>,
}

impl Values<'_> {
    fn parameter(
        &self,
        field: &str,
        definition: &ParameterDefinition,
        value: &parameter_value::Value,
    ) -> Check {
        use super::parameters as rules;
        use ParameterType as T;
        use parameter_value::Value as V;
        let kind = parameter_type(definition);
        if !rules::accepts(kind, value) {
            return Err(ValidationError::new(
                ErrorKind::WrongParameterType,
                field,
                format!("expected {}, got {}", type_name(kind), describe(value)),
            ));
        }
        match (kind, value) {
            (T::Integer | T::FloatingPoint, V::Integer(i)) => {
                within_bounds(field, *i as f64, &i.to_string(), definition)
            }
            (T::FloatingPoint, V::FloatingPoint(f)) => {
                if !f.is_finite() {
                    return Err(ValidationError::invalid(
                        field,
                        format!("expected a finite number, got {f}"),
                    ));
                }
                within_bounds(field, *f, &f.to_string(), definition)
            }
            (T::Enumeration, V::Enumeration(name) | V::Text(name)) => {
                if rules::option(definition, name).is_some() {
                    return Ok(());
                }
                let options: Vec<String> =
                    definition.options.iter().map(|o| quoted(&o.name)).collect();
                Err(ValidationError::invalid(
                    field,
                    format!(
                        "{} is not an option; expected one of {} (or an option's value)",
                        quoted(name),
                        options.join(", ")
                    ),
                ))
            }
            (_, V::File(f)) => file(field, f),
            (_, V::Peer(p)) => peer(field, p),
            (_, V::LicenseServer(l)) => self.license(field, l),
            (_, V::Ingress(i)) => ingress(field, i),
            (_, V::NetworkIp(n)) => network_ip(field, n),
            _ => Ok(()),
        }
    }

    fn license(&self, field: &str, license: &LicenseServerValue) -> Check {
        let field = format!("{field}.licenseServer.id");
        non_empty(&field, &license.id)?;
        if self.config.license_ids.contains(&license.id.as_str()) {
            return Ok(());
        }
        let known: Vec<String> = self
            .config
            .license_ids
            .iter()
            .take(10)
            .map(|k| quoted(k))
            .collect();
        let known = if known.is_empty() {
            "none are configured".to_owned()
        } else {
            format!("known: {}", known.join(", "))
        };
        Err(ValidationError::new(
            ErrorKind::UnknownLicense,
            field,
            format!("unknown license server {} ({known})", quoted(&license.id)),
        ))
    }
}

fn within_bounds(field: &str, x: f64, shown: &str, definition: &ParameterDefinition) -> Check {
    let range = match (definition.min, definition.max) {
        (Some(min), Some(max)) if x < min || x > max => {
            format!("between {} and {}", number(min), number(max))
        }
        (Some(min), None) if x < min => format!("at least {}", number(min)),
        (None, Some(max)) if x > max => format!("at most {}", number(max)),
        _ => return Ok(()),
    };
    Err(ValidationError::invalid(
        field,
        format!("{shown} is out of range: must be {range}"),
    ))
}

fn file(field: &str, f: &FileValue) -> Check {
    storage_path(&format!("{field}.file.path"), &f.path)
}

fn peer(field: &str, p: &PeerValue) -> Check {
    let host_field = format!("{field}.peer.hostname");
    non_empty(&host_field, &p.hostname)?;
    if !names::is_peer_hostname(&p.hostname) {
        return Err(ValidationError::invalid(
            host_field,
            format!(
                "host name {} must be lower-case letters, digits and '-', at most {} characters, \
                 start with a letter and not with `j-`: it names a Service in the job's namespace",
                quoted(&p.hostname),
                names::DNS_LABEL_MAX
            ),
        ));
    }
    job_id_at(&format!("{field}.peer.jobId"), &p.job_id)
}

/// Every peer of a job: not the job itself, and each host name naming one peer job.
fn distinct_peers(job: &SubmitJob) -> Check {
    let from_resources = job
        .resources
        .iter()
        .enumerate()
        .filter_map(|(i, r)| match &r.value {
            Some(resource_value::Value::Peer(p)) => Some((format!("resources[{i}].peer"), p)),
            _ => None,
        });
    let from_parameters = job
        .parameters
        .iter()
        .filter_map(|(name, v)| match &v.value {
            Some(parameter_value::Value::Peer(p)) => Some((format!("parameters.{name}.peer"), p)),
            _ => None,
        });
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    for (field, p) in from_resources.chain(from_parameters) {
        if p.job_id == job.job_id {
            return Err(ValidationError::invalid(
                format!("{field}.jobId"),
                "a job cannot be its own peer",
            ));
        }
        match seen.insert(&p.hostname, &p.job_id) {
            Some(other) if other != p.job_id => {
                return Err(ValidationError::invalid(
                    format!("{field}.hostname"),
                    format!(
                        "host name {} already names peer job {}",
                        quoted(&p.hostname),
                        quoted(other)
                    ),
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// The file an interactive application opens must be one the job can see: inside (or equal to) an input
/// file or folder, or inside the output folder, as the runner's mounts translate it.
fn opened_file_is_mounted(job: &SubmitJob, path: &str) -> Check {
    fn components(p: &str) -> Vec<&str> {
        p.split('/').filter(|c| !c.is_empty()).collect()
    }
    let opened = components(path);
    let files = job
        .resources
        .iter()
        .filter_map(|r| match &r.value {
            Some(resource_value::Value::File(f)) => Some(f.path.as_str()),
            _ => None,
        })
        .chain(job.parameters.values().filter_map(|v| match &v.value {
            Some(parameter_value::Value::File(f)) => Some(f.path.as_str()),
            _ => None,
        }));
    let mut mounted = files.chain(job.output_folder.as_deref());
    if mounted.any(|folder| opened.starts_with(&components(folder))) {
        return Ok(());
    }
    Err(ValidationError::invalid(
        "openedFile",
        format!(
            "{} is not inside any folder the job mounts (its input files and folders and its output \
             folder)",
            quoted(path)
        ),
    ))
}

fn ingress(field: &str, i: &IngressValue) -> Check {
    non_empty(&format!("{field}.ingress.id"), &i.id)?;
    let domain_field = format!("{field}.ingress.domain");
    non_empty(&domain_field, &i.domain)?;
    if !names::is_dns_subdomain(&i.domain) {
        return Err(ValidationError::invalid(
            domain_field,
            format!("domain {} must be a DNS-1123 subdomain", quoted(&i.domain)),
        ));
    }
    Ok(())
}

fn network_ip(field: &str, n: &NetworkIpValue) -> Check {
    non_empty(&format!("{field}.networkIp.id"), &n.id)?;
    let ip_field = format!("{field}.networkIp.ipAddress");
    non_empty(&ip_field, &n.ip_address)?;
    if n.ip_address.parse::<IpAddr>().is_err() {
        return Err(ValidationError::invalid(
            ip_field,
            format!("{} is not an IP address", quoted(&n.ip_address)),
        ));
    }
    for (j, range) in n.open_ports.iter().enumerate() {
        let range_field = format!("{field}.networkIp.openPorts[{j}]");
        port(&format!("{range_field}.start"), range.start)?;
        port(&format!("{range_field}.end"), range.end)?;
        if range.end < range.start {
            return Err(ValidationError::invalid(
                format!("{range_field}.end"),
                format!("end {} is before start {}", range.end, range.start),
            ));
        }
        match Protocol::try_from(range.protocol) {
            Ok(Protocol::Tcp | Protocol::Udp) => {}
            _ => {
                return Err(ValidationError::invalid(
                    format!("{range_field}.protocol"),
                    "required: PROTOCOL_TCP or PROTOCOL_UDP",
                ));
            }
        }
    }
    Ok(())
}

/// Public links and public IPs bind to one pod, so they need a single-replica job.
fn single_replica_resources(job: &SubmitJob) -> Check {
    if job.replicas <= 1 {
        return Ok(());
    }
    let from_resources = job.resources.iter().enumerate().map(|(i, r)| {
        let kind = match &r.value {
            Some(resource_value::Value::Ingress(_)) => Some("ingress"),
            Some(resource_value::Value::NetworkIp(_)) => Some("networkIp"),
            _ => None,
        };
        (format!("resources[{i}]"), kind)
    });
    let from_parameters = job.parameters.iter().map(|(name, v)| {
        let kind = match &v.value {
            Some(parameter_value::Value::Ingress(_)) => Some("ingress"),
            Some(parameter_value::Value::NetworkIp(_)) => Some("networkIp"),
            _ => None,
        };
        (format!("parameters.{name}"), kind)
    });
    for (field, kind) in from_resources.chain(from_parameters) {
        match kind {
            Some("ingress") => {
                return Err(ValidationError::new(
                    ErrorKind::Unsupported,
                    format!("{field}.ingress"),
                    INGRESS_MULTI_REPLICA,
                ));
            }
            Some(kind) => {
                return Err(ValidationError::new(
                    ErrorKind::Unsupported,
                    format!("{field}.{kind}"),
                    NETWORK_IP_MULTI_REPLICA,
                ));
            }
            None => {}
        }
    }
    Ok(())
}

/// A path in the storage: absolute, naming something below the root, without `.` or `..`.
fn storage_path(field: &str, path: &str) -> Check {
    if path.is_empty() {
        return Err(ValidationError::missing(field));
    }
    if !path.starts_with('/') {
        return Err(ValidationError::invalid(
            field,
            format!(
                "must be an absolute path (starting with /), got {}",
                quoted(path)
            ),
        ));
    }
    if path.len() > PATH_MAX {
        return Err(ValidationError::invalid(
            field,
            format!(
                "path is {} bytes long, at most {PATH_MAX} are allowed",
                path.len()
            ),
        ));
    }
    if path.chars().any(char::is_control) {
        return Err(ValidationError::invalid(
            field,
            "must not contain control characters",
        ));
    }
    let mut components = path.split('/').filter(|c| !c.is_empty()).peekable();
    if components.peek().is_none() {
        return Err(ValidationError::invalid(
            field,
            "must name a file or folder below the storage root, not / itself",
        ));
    }
    if let Some(dots) = components.find(|c| *c == ".." || *c == ".") {
        return Err(ValidationError::invalid(
            field,
            format!("must not contain a `{dots}` component: {}", quoted(path)),
        ));
    }
    Ok(())
}

fn port(field: &str, port: u32) -> Check {
    if !(1..=65535).contains(&port) {
        return Err(ValidationError::invalid(
            field,
            format!("port {port} is outside 1..=65535"),
        ));
    }
    Ok(())
}

fn non_empty(field: &str, value: &str) -> Check {
    if value.is_empty() {
        return Err(ValidationError::missing(field));
    }
    Ok(())
}

/// The declared type; definitions were checked before values, so an unknown number cannot reach here,
/// but it maps to `Unspecified` rather than panicking.
fn parameter_type(definition: &ParameterDefinition) -> ParameterType {
    ParameterType::try_from(definition.r#type).unwrap_or(ParameterType::Unspecified)
}

fn type_name(kind: ParameterType) -> &'static str {
    match kind {
        ParameterType::Unspecified => "unspecified",
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
        ParameterType::Ingress => "ingress",
        ParameterType::NetworkIp => "network IP",
    }
}

fn describe(value: &parameter_value::Value) -> String {
    use parameter_value::Value as V;
    match value {
        V::Text(s) => format!("text {}", quoted(s)),
        V::Textarea(s) => format!("textarea {}", quoted(s)),
        V::Integer(i) => format!("integer {i}"),
        V::FloatingPoint(f) => format!("floating point {f}"),
        V::Boolean(b) => format!("boolean {b}"),
        V::Enumeration(s) => format!("enumeration {}", quoted(s)),
        V::File(f) => format!("file {}", quoted(&f.path)),
        V::Peer(p) => format!("peer {}", quoted(&p.hostname)),
        V::LicenseServer(l) => format!("license server {}", quoted(&l.id)),
        V::Ingress(i) => format!("ingress {}", quoted(&i.domain)),
        V::NetworkIp(n) => format!("network IP {}", quoted(&n.ip_address)),
    }
}

/// A bound as people write it: `4`, not `4.0`.
fn number(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::messages::{Format, decode, v1};
    use crate::validate::submit;

    fn example(name: &str) -> SubmitJob {
        let path = format!("{}/schemas/examples/{name}", env!("CARGO_MANIFEST_DIR"));
        decode(Format::Json, &std::fs::read(path).unwrap()).unwrap()
    }

    fn config() -> Config {
        let mut config = Config::default();
        config.licenses.insert(
            "matlab-campus".into(),
            crate::config::LicenseServer {
                address: "license.cloud.sdu.dk".into(),
                port: 27000,
                license: None,
            },
        );
        config
    }

    /// Applies `edit` to an example and returns the error, which must exist.
    fn rejected(name: &str, edit: impl FnOnce(&mut SubmitJob)) -> ValidationError {
        let mut job = example(name);
        assert_eq!(
            submit(&job, &config()),
            Ok(()),
            "{name} must be valid before the edit"
        );
        edit(&mut job);
        submit(&job, &config()).expect_err("the edit must make the job invalid")
    }

    fn param(job: &mut SubmitJob, name: &str, value: parameter_value::Value) {
        job.parameters
            .insert(name.into(), v1::ParameterValue { value: Some(value) });
    }

    /// The example from the issue, word for word.
    #[test]
    fn wrong_parameter_type_message() {
        let e = rejected("submit-job.mpi-2-nodes.json", |j| {
            param(j, "threads", parameter_value::Value::Text("four".into()))
        });
        assert_eq!(
            e.to_string(),
            r#"parameters.threads: expected integer, got text "four""#
        );
        assert_eq!(e.reason(), "wrong_parameter_type");
    }

    /// A job id short enough for a one-rank job can still be too long for the host names of many ranks.
    #[test]
    fn pod_host_names_must_fit() {
        let id = "4".repeat(55);
        let mut job = example("submit-job.mpi-2-nodes.json");
        job.job_id = id.clone();
        // j- + 55 + -job-1 = 63 characters: fine.
        assert_eq!(submit(&job, &config()), Ok(()));
        job.replicas = 11;
        // j- + 54 + -job-10 = 63: still fine. One more character in the id is not.
        job.job_id = "4".repeat(54);
        assert_eq!(submit(&job, &config()), Ok(()));
        job.job_id = "4".repeat(55);
        let e = submit(&job, &config()).unwrap_err();
        assert_eq!(e.field(), "jobId");
        assert!(e.message().contains("pod host name"), "{e}");
    }

    /// Floating point values must be finite and within bounds; integer bounds print as integers.
    #[test]
    fn numbers() {
        let e = rejected("submit-job.mpi-2-nodes.json", |j| {
            param(j, "threads", parameter_value::Value::Integer(0))
        });
        assert_eq!(
            e.to_string(),
            "parameters.threads: 0 is out of range: must be between 1 and 64"
        );
        let with_float = |value: f64| {
            let mut job = example("submit-job.mpi-2-nodes.json");
            let app = job.application.as_mut().unwrap();
            app.parameters.push(v1::ParameterDefinition {
                name: "tolerance".into(),
                r#type: ParameterType::FloatingPoint as i32,
                optional: true,
                min: Some(0.0),
                ..Default::default()
            });
            param(
                &mut job,
                "tolerance",
                parameter_value::Value::FloatingPoint(value),
            );
            submit(&job, &config())
        };
        assert_eq!(with_float(0.25), Ok(()));
        let e = with_float(f64::NAN).unwrap_err();
        assert_eq!(
            e.to_string(),
            "parameters.tolerance: expected a finite number, got NaN"
        );
        let e = with_float(-0.5).unwrap_err();
        assert_eq!(
            e.to_string(),
            "parameters.tolerance: -0.5 is out of range: must be at least 0"
        );
    }

    /// License ids are checked against the configuration.
    #[test]
    fn licenses() {
        let job = example("submit-job.matlab-web.json");
        let e = submit(&job, &Config::default()).unwrap_err();
        assert_eq!(e.field(), "parameters.license.licenseServer.id");
        assert_eq!(e.kind(), ErrorKind::UnknownLicense);
        assert!(e.message().contains("none are configured"), "{e}");
    }

    /// Replicas are bounded by the configuration.
    #[test]
    fn replica_limit_comes_from_config() {
        let job = example("submit-job.mpi-2-nodes.json");
        let mut config = config();
        config.limits.max_replicas = 1;
        let e = submit(&job, &config).unwrap_err();
        assert_eq!(
            e.to_string(),
            "replicas: 2 replicas asked for, at most 1 are allowed (limits.max_replicas)"
        );
        assert_eq!(e.reason(), "limit_exceeded");
    }

    /// Timestamps and durations outside the proto3 ranges, which only protobuf can carry.
    #[test]
    fn time_ranges() {
        let e = rejected("submit-job.figlet.json", |j| {
            j.submitted_at = Some(pbjson_types::Timestamp {
                seconds: i64::MAX,
                nanos: 0,
            })
        });
        assert_eq!(e.field(), "submittedAt");
        let e = rejected("submit-job.figlet.json", |j| {
            j.submitted_at = Some(pbjson_types::Timestamp {
                seconds: 0,
                nanos: -1,
            })
        });
        assert_eq!(e.field(), "submittedAt");
        let e = rejected("submit-job.figlet.json", |j| {
            j.time_allocation = Some(pbjson_types::Duration {
                seconds: i64::MIN,
                nanos: 0,
            })
        });
        assert_eq!(e.field(), "timeAllocation");
    }

    /// A whole-node job without a time limit would hold its nodes forever: refused, naming the field;
    /// with one it passes.
    #[test]
    fn whole_nodes_need_a_time_limit() {
        let e = rejected("submit-job.figlet.json", |j| {
            j.exclusive_nodes = true;
            j.time_allocation = None;
        });
        assert_eq!((e.field(), e.reason()), ("timeAllocation", "missing_field"));
        assert!(e.message().contains("exclusiveNodes"), "{e}");
        let mut job = example("submit-job.figlet.json");
        job.exclusive_nodes = true;
        assert!(job.time_allocation.is_some());
        assert_eq!(submit(&job, &config()), Ok(()));
        job.exclusive_nodes = false;
        job.time_allocation = None;
        assert_eq!(submit(&job, &config()), Ok(()));
    }

    /// A start window needs both ends in order and a time limit; each problem names its field.
    #[test]
    fn start_windows() {
        use crate::messages::v1::StartWindow;
        let at = |seconds| Some(pbjson_types::Timestamp { seconds, nanos: 0 });
        let e = rejected("submit-job.booked.json", |j| {
            j.start_window.as_mut().unwrap().latest = None;
        });
        assert_eq!(
            (e.field(), e.reason()),
            ("startWindow.latest", "missing_field")
        );
        let e = rejected("submit-job.booked.json", |j| {
            j.start_window = Some(StartWindow {
                earliest: at(2_000),
                latest: at(1_000),
            });
        });
        assert_eq!(
            (e.field(), e.reason()),
            ("startWindow.latest", "invalid_field")
        );
        let e = rejected("submit-job.booked.json", |j| j.time_allocation = None);
        assert_eq!((e.field(), e.reason()), ("timeAllocation", "missing_field"));
        assert!(e.message().contains("startWindow"), "{e}");
        let e = rejected("submit-job.booked.json", |j| {
            j.start_window.as_mut().unwrap().earliest = at(i64::MAX);
        });
        assert_eq!(e.field(), "startWindow.earliest");
        let job = example("submit-job.booked.json");
        assert_eq!(submit(&job, &config()), Ok(()));
    }

    /// The application's own rules: ports, option names, flags, unknown numbers.
    #[test]
    fn application_rules() {
        let app = |j: &mut SubmitJob| j.application.as_mut().unwrap().clone();
        let e = rejected("submit-job.matlab-web.json", |j| {
            j.application.as_mut().unwrap().web_port = Some(70000)
        });
        assert_eq!(e.field(), "application.webPort");
        let e = rejected("submit-job.figlet.json", |j| {
            let mut a = app(j);
            a.application_type = ApplicationType::Vnc as i32;
            j.application = Some(a);
        });
        assert_eq!(
            (e.field(), e.kind()),
            ("application.vncPort", ErrorKind::Missing)
        );
        let e = rejected("submit-job.figlet.json", |j| {
            let a = j.application.as_mut().unwrap();
            a.parameters[1].options[1].name = "Standard".into();
        });
        assert_eq!(e.field(), "application.parameters[1].options[1].name");
        let e = rejected("submit-job.mpi-2-nodes.json", |j| {
            let a = j.application.as_mut().unwrap();
            if let Some(invocation_parameter::Kind::BoolFlag(f)) = &mut a.invocation[3].kind {
                f.flag = "  ".into();
            }
        });
        assert_eq!(e.field(), "application.invocation[3].boolFlag.flag");
        let e = rejected("submit-job.figlet.json", |j| {
            j.application.as_mut().unwrap().parameters[0].r#type = 99;
        });
        assert_eq!(
            e.to_string(),
            "application.parameters[0].type: unknown parameter type 99"
        );
        let e = rejected("submit-job.figlet.json", |j| {
            j.application.as_mut().unwrap().invocation[0].kind = None;
        });
        assert_eq!(e.field(), "application.invocation[0]");
    }

    /// Resources: empty ones, port ranges and protocols, peers' job ids.
    #[test]
    fn resources() {
        let e = rejected("submit-job.figlet.json", |j| {
            j.resources.push(v1::ResourceValue { value: None })
        });
        assert_eq!(e.field(), "resources[0]");
        let ip = |start, end, protocol| v1::ResourceValue {
            value: Some(resource_value::Value::NetworkIp(v1::NetworkIpValue {
                id: "ip-1".into(),
                ip_address: "2001:db8::7".into(),
                open_ports: vec![v1::PortRange {
                    start,
                    end,
                    protocol,
                }],
            })),
        };
        let mut job = example("submit-job.figlet.json");
        job.resources.push(ip(8000, 8080, Protocol::Tcp as i32));
        assert_eq!(submit(&job, &config()), Ok(()));
        let e = rejected("submit-job.figlet.json", |j| {
            j.resources.push(ip(90, 80, 1))
        });
        assert_eq!(
            e.to_string(),
            "resources[0].networkIp.openPorts[0].end: end 80 is before start 90"
        );
        let e = rejected("submit-job.figlet.json", |j| {
            j.resources.push(ip(80, 90, 0))
        });
        assert_eq!(e.field(), "resources[0].networkIp.openPorts[0].protocol");
        let e = rejected("submit-job.matlab-web.json", |j| {
            param(
                j,
                "database",
                parameter_value::Value::Peer(v1::PeerValue {
                    hostname: "postgres".into(),
                    job_id: "4790-".into(),
                }),
            )
        });
        assert_eq!(e.field(), "parameters.database.peer.jobId");
    }

    /// Storage paths: root, `.` and control characters are rejected too.
    #[test]
    fn storage_paths() {
        for (path, part) in [
            ("/", "not / itself"),
            ("//", "not / itself"),
            ("/a/./b", "`.`"),
            ("/a/..", "`..`"),
            ("/a\u{7}b", "control"),
            ("", "required"),
        ] {
            let e = storage_path("outputFolder", path).unwrap_err();
            assert!(e.message().contains(part), "{path:?}: {e}");
        }
        for ok in [
            "/home/alice",
            "/a//b/",
            "/a/..b/c.",
            "/projects/x/Members' Files/y",
        ] {
            assert_eq!(storage_path("outputFolder", ok), Ok(()), "{ok}");
        }
    }
}
