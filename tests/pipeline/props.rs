//! Property tests of the pipeline: the template language on generated input (never panics, the affix
//! rules hold), owner namespaces (always valid, distinct owners never share one), any valid job renders to
//! objects the cluster accepts, and the accounting tick computation (no gap, no overlap, one final tick at
//! the real end, never before the start) and the expiry decision.

use crate::pipeline_support;

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use volcano_runner::messages::v1::{
    Application, BooleanFlagInvocation, EnumOption, EnvironmentVariableInvocation, FileValue,
    InvocationParameter, LicenseServerValue, Owner, ParameterDefinition, ParameterType,
    ParameterValue, PeerValue, Product, ResourceValue, SubmitJob, VariableInvocation,
    WordInvocation, invocation_parameter::Kind, parameter_value::Value, resource_value,
};
use volcano_runner::pipeline::plugins::accounting::{Horizon, Tick, TickCursor, TickSchedule};
use volcano_runner::pipeline::plugins::expiry::{Decision, decide};
use volcano_runner::pipeline::plugins::parameter::{Arguments, Target, TemplateError, expand};
use volcano_runner::pipeline::{names, render};

// ---------------------------------------------------------------------------------------------------
// The template language.

/// Text values by name; booleans by name; any other name has no value.
#[derive(Debug, Clone, Default)]
struct Values {
    text: BTreeMap<String, String>,
    booleans: BTreeMap<String, bool>,
}

impl Arguments for Values {
    fn argument(&self, name: &str) -> Result<Option<String>, TemplateError> {
        Ok(self
            .text
            .get(name)
            .cloned()
            .or_else(|| self.booleans.get(name).map(ToString::to_string)))
    }
    fn boolean(&self, name: &str) -> Result<Option<bool>, TemplateError> {
        match (self.booleans.get(name), self.text.contains_key(name)) {
            (Some(b), _) => Ok(Some(*b)),
            (None, true) => Err(TemplateError::Parameter {
                name: name.into(),
                message: "not a boolean".into(),
            }),
            (None, false) => Ok(None),
        }
    }
}

fn affix() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("   ".to_owned()),
        "[ ]{0,2}--[a-z]{1,4}[ ]{0,2}",
        "\\PC{0,6}"
    ]
}

fn var() -> impl Strategy<Value = VariableInvocation> {
    (
        vec("[a-e]", 0..5),
        affix(),
        affix(),
        affix(),
        affix(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(names, pg, sg, pv, sv, glue_p, glue_s)| VariableInvocation {
                variable_names: names,
                prefix_global: pg,
                suffix_global: sg,
                prefix_variable: pv,
                suffix_variable: sv,
                is_prefix_variable_part_of_arg: glue_p,
                is_suffix_variable_part_of_arg: glue_s,
            },
        )
}

fn values() -> impl Strategy<Value = Values> {
    (
        btree_map("[a-e]", "\\PC{0,8}", 0..4),
        btree_map("[a-e]", any::<bool>(), 0..3),
    )
        .prop_map(|(text, booleans)| {
            let booleans = booleans
                .into_iter()
                .filter(|(k, _)| !text.contains_key(k))
                .collect();
            Values { text, booleans }
        })
}

fn element() -> impl Strategy<Value = InvocationParameter> {
    let kind = prop_oneof![
        "\\PC{0,10}".prop_map(|word| Some(Kind::Word(WordInvocation { word }))),
        var().prop_map(|v| Some(Kind::Var(v))),
        ("[a-e]", "\\PC{0,10}").prop_map(|(variable_name, flag)| Some(Kind::BoolFlag(
            BooleanFlagInvocation {
                variable_name,
                flag
            }
        ))),
        "\\PC{0,10}"
            .prop_map(|variable| Some(Kind::Env(EnvironmentVariableInvocation { variable }))),
        Just(None),
    ];
    kind.prop_map(|kind| InvocationParameter { kind })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any element with any values expands or fails cleanly, in both contexts; never panics.
    #[test]
    fn template_never_panics(element in element(), values in values()) {
        let command = expand(&element, Target::Command, &values);
        let env = expand(&element, Target::Environment, &values);
        if element.kind.is_none() {
            prop_assert!(command.is_err() && env.is_err());
        }
        if let Some(Kind::Env(e)) = &element.kind {
            prop_assert!(command.unwrap().is_empty());
            prop_assert_eq!(env.unwrap(), vec![format!("$({})", e.variable)]);
        }
    }

    /// The `var` rules: nothing at all without values; otherwise the trimmed global prefix first and
    /// suffix last when not blank; per value, a separate non-blank prefix before it and suffix after it, or
    /// glued to it; the values in the order of the variable names.
    #[test]
    fn var_affix_rules(v in var(), values in values()) {
        let out = expand(&InvocationParameter { kind: Some(Kind::Var(v.clone())) }, Target::Command, &values).unwrap();
        let present: Vec<String> = v.variable_names.iter().filter_map(|n| values.argument(n).unwrap()).collect();
        if present.is_empty() {
            prop_assert!(out.is_empty());
            return Ok(());
        }
        let (pg, sg, pv, sv) = (v.prefix_global.trim(), v.suffix_global.trim(), v.prefix_variable.trim(), v.suffix_variable.trim());
        let separate = |affix: &str, glued: bool| usize::from(!affix.is_empty() && !glued);
        let per_value = 1 + separate(pv, v.is_prefix_variable_part_of_arg) + separate(sv, v.is_suffix_variable_part_of_arg);
        prop_assert_eq!(out.len(), usize::from(!pg.is_empty()) + present.len() * per_value + usize::from(!sg.is_empty()));
        let mut rest: &[String] = &out;
        if !pg.is_empty() {
            prop_assert_eq!(&rest[0], pg);
            rest = &rest[1..];
        }
        if !sg.is_empty() {
            prop_assert_eq!(rest.last().unwrap(), sg);
            rest = &rest[..rest.len() - 1];
        }
        for (chunk, value) in rest.chunks(per_value).zip(&present) {
            let mut chunk = chunk.iter();
            if separate(pv, v.is_prefix_variable_part_of_arg) == 1 {
                prop_assert_eq!(chunk.next().unwrap(), pv);
            }
            let arg = chunk.next().unwrap();
            let mut expected = value.clone();
            if v.is_prefix_variable_part_of_arg {
                expected = format!("{pv}{expected}");
            }
            if v.is_suffix_variable_part_of_arg {
                expected.push_str(sv);
            }
            prop_assert_eq!(arg, &expected);
            if separate(sv, v.is_suffix_variable_part_of_arg) == 1 {
                prop_assert_eq!(chunk.next().unwrap(), sv);
            }
        }
    }

    /// `bool_flag`: the trimmed flag exactly when the value is true and the flag not blank.
    #[test]
    fn flag_rules(flag in "\\PC{0,10}", value in proptest::option::of(any::<bool>())) {
        let mut values = Values::default();
        if let Some(b) = value {
            values.booleans.insert("v".into(), b);
        }
        let element = InvocationParameter { kind: Some(Kind::BoolFlag(BooleanFlagInvocation { variable_name: "v".into(), flag: flag.clone() })) };
        let out = expand(&element, Target::Command, &values).unwrap();
        if value == Some(true) && !flag.trim().is_empty() {
            prop_assert_eq!(out, vec![flag.trim().to_owned()]);
        } else {
            prop_assert!(out.is_empty());
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Owner namespaces.

fn owner() -> impl Strategy<Value = Owner> {
    ("\\PC{1,40}", proptest::option::of("\\PC{0,80}"))
        .prop_map(|(user, project)| Owner { user, project })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Any owner gives a valid namespace name (DNS-1123 label), with any configured prefix.
    #[test]
    fn any_owner_gives_a_valid_namespace(owner in owner(), prefix in prop_oneof![Just(""), Just("app-"), Just("ucloud-jobs-"), Just("x")]) {
        let name = names::owner_namespace(prefix, &owner);
        prop_assert!(names::is_dns1123_label(&name), "{:?} -> {:?}", owner, name);
        prop_assert!(name.starts_with(prefix));
    }

    /// Distinct owners get distinct namespaces (the owner is the project when there is one, else the user).
    #[test]
    fn distinct_owners_get_distinct_namespaces(a in owner(), b in owner()) {
        let key = |o: &Owner| match o.project.as_deref() {
            Some(p) if !p.is_empty() => ("project", p.to_owned()),
            _ => ("user", o.user.clone()),
        };
        let (na, nb) = (names::owner_namespace("app-", &a), names::owner_namespace("app-", &b));
        prop_assert_eq!(key(&a) == key(&b), na == nb, "{:?} {:?} -> {} {}", a, b, na, nb);
    }

    /// Owners that differ only in case or punctuation, whose readable parts collide, still differ.
    #[test]
    fn lookalike_owners_differ(base in "[a-z]{1,12}") {
        let variants = [base.clone(), base.to_uppercase(), format!("{base}."), format!("-{base}"), format!("{base} ")];
        let names: std::collections::BTreeSet<String> = variants.iter()
            .map(|u| names::owner_namespace("app-", &Owner { user: u.clone(), project: None }))
            .collect();
        prop_assert_eq!(names.len(), variants.iter().collect::<std::collections::BTreeSet<_>>().len());
    }
}

// ---------------------------------------------------------------------------------------------------
// Any valid job renders.

#[derive(Debug, Clone)]
enum Param {
    Text(String),
    Integer(i64),
    Float(f64),
    Boolean(bool, Option<(String, String)>),
    Enumeration(usize),
    File(String, bool),
    Directory(String),
    Peer(String),
    License(bool),
}

fn param() -> impl Strategy<Value = Param> {
    prop_oneof![
        "\\PC{0,20}".prop_map(Param::Text),
        any::<i64>().prop_map(Param::Integer),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Param::Float),
        (
            any::<bool>(),
            proptest::option::of(("[a-z]{1,4}", "[a-z]{1,4}"))
        )
            .prop_map(|(b, tf)| Param::Boolean(b, tf)),
        (0usize..3).prop_map(Param::Enumeration),
        (path(), any::<bool>()).prop_map(|(p, ro)| Param::File(p, ro)),
        path().prop_map(Param::Directory),
        "[a-z]{1,5}[0-9]{0,3}".prop_map(Param::Peer),
        any::<bool>().prop_map(Param::License),
    ]
}

fn path() -> impl Strategy<Value = String> {
    vec("[a-zA-Z0-9_][a-zA-Z0-9_. ']{0,8}", 1..5).prop_map(|parts| format!("/{}", parts.join("/")))
}

fn job_strategy() -> impl Strategy<Value = SubmitJob> {
    (
        "[0-9]([a-z0-9-]{0,18}[a-z0-9])?",
        owner(),
        1u32..=64,
        (
            0u32..=128,
            0u32..=1024,
            0u32..=8,
            "[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?",
        ),
        vec(param(), 0..10),
        (
            proptest::option::of(1i64..1_000_000),
            proptest::option::of(path()),
            vec(path(), 0..4),
        ),
        (any::<bool>(), proptest::option::of(1u32..=65535), 0i32..=4),
    )
        .prop_map(
            |(
                job_id,
                owner,
                replicas,
                (cpu, memory_gib, gpu, category),
                params,
                (time, output, folders),
                (ingress, web_port, app_type),
            )| {
                let mut definitions = Vec::new();
                let mut values = BTreeMap::new();
                let mut invocation = vec![InvocationParameter {
                    kind: Some(Kind::Word(WordInvocation { word: "run".into() })),
                }];
                let mut environment = BTreeMap::new();
                for (i, p) in params.into_iter().enumerate() {
                    let name = format!("p{i}");
                    let mut def = ParameterDefinition {
                        name: name.clone(),
                        ..ParameterDefinition::default()
                    };
                    let (t, value) = match p {
                        Param::Text(s) => (ParameterType::Text, Value::Text(s)),
                        Param::Integer(n) => (ParameterType::Integer, Value::Integer(n)),
                        Param::Float(f) => (ParameterType::FloatingPoint, Value::FloatingPoint(f)),
                        Param::Boolean(b, tf) => {
                            if let Some((t, f)) = tf {
                                (def.true_value, def.false_value) = (Some(t), Some(f));
                            }
                            (ParameterType::Boolean, Value::Boolean(b))
                        }
                        Param::Enumeration(k) => {
                            def.options = (0..3)
                                .map(|o| EnumOption {
                                    name: format!("O{o}"),
                                    value: format!("-v{o}"),
                                })
                                .collect();
                            (
                                ParameterType::Enumeration,
                                Value::Enumeration(format!("O{k}")),
                            )
                        }
                        Param::File(path, read_only) => (
                            ParameterType::InputFile,
                            Value::File(FileValue { path, read_only }),
                        ),
                        Param::Directory(path) => (
                            ParameterType::InputDirectory,
                            Value::File(FileValue {
                                path,
                                read_only: false,
                            }),
                        ),
                        Param::Peer(host) => (
                            ParameterType::Peer,
                            Value::Peer(PeerValue {
                                hostname: format!("{host}x{i}"),
                                job_id: format!("peer{i}"),
                            }),
                        ),
                        Param::License(with_key) => (
                            ParameterType::LicenseServer,
                            Value::LicenseServer(LicenseServerValue {
                                id: if with_key { "L1" } else { "L2" }.into(),
                            }),
                        ),
                    };
                    def.r#type = t as i32;
                    if t == ParameterType::Boolean && i % 2 == 0 {
                        invocation.push(InvocationParameter {
                            kind: Some(Kind::BoolFlag(BooleanFlagInvocation {
                                variable_name: name.clone(),
                                flag: format!("--{name}"),
                            })),
                        });
                    } else {
                        invocation.push(InvocationParameter {
                            kind: Some(Kind::Var(VariableInvocation {
                                variable_names: vec![name.clone()],
                                prefix_variable: format!("--{name}"),
                                ..VariableInvocation::default()
                            })),
                        });
                    }
                    if i % 3 == 0 {
                        environment.insert(
                            format!("P{i}"),
                            InvocationParameter {
                                kind: Some(Kind::Var(VariableInvocation {
                                    variable_names: vec![name.clone()],
                                    ..VariableInvocation::default()
                                })),
                            },
                        );
                    }
                    definitions.push(def);
                    values.insert(name, ParameterValue { value: Some(value) });
                }
                let mut resources: Vec<ResourceValue> = folders
                    .into_iter()
                    .map(|path| ResourceValue {
                        value: Some(resource_value::Value::File(FileValue {
                            path,
                            read_only: false,
                        })),
                    })
                    .collect();
                if ingress && replicas == 1 {
                    resources.push(ResourceValue {
                        value: Some(resource_value::Value::Ingress(
                            volcano_runner::messages::v1::IngressValue {
                                id: "i".into(),
                                domain: "app-x.cloud.sdu.dk".into(),
                            },
                        )),
                    });
                }
                SubmitJob {
                    job_id,
                    owner: Some(owner),
                    job_name: None,
                    application: Some(Application {
                        name: "app".into(),
                        version: "1".into(),
                        image: "registry.example.org/app:1.0".into(),
                        invocation,
                        environment,
                        parameters: definitions,
                        web_port,
                        application_type: app_type,
                        ..Application::default()
                    }),
                    product: Some(Product {
                        id: format!("{category}-p"),
                        category,
                        cpu,
                        memory_gib,
                        gpu,
                    }),
                    replicas,
                    time_allocation: time.map(|s| pbjson_types::Duration {
                        seconds: s,
                        nanos: 0,
                    }),
                    parameters: values,
                    resources,
                    output_folder: output,
                    submitted_at: None,
                    opened_file: None,
                    // Any generated bool will do: it varies with the draw.
                    exclusive_nodes: ingress,
                    // A traced job needs its output folder; tracing has its own tests.
                    traced: false,
                    // Not sealed: a sealed job with a peer, a link or a license is refused.
                    sealed: false,
                    // Rendering never reads it: a booking is the submit path's, after rendering.
                    start_window: None,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Any valid job renders, with both configurations, to a VolcanoJob the CRD schema and Volcano's
    /// admission accept, whose mount points are unique and whose argv contains every mount point used.
    #[test]
    fn any_valid_job_renders(job in job_strategy()) {
        for mut config in [pipeline_support::defaults(), pipeline_support::reference()] {
            // Whole nodes are offered only for a product the operator has priced them for.
            if job.exclusive_nodes {
                let category = job.product.clone().unwrap_or_default().category;
                config.pipeline.whole_nodes.products.insert(
                    category,
                    toml::from_str("product = \"node\"\ncpu = 64\nmemory_gib = 256").unwrap(),
                );
            }
            let desired = render(&job, &config, pipeline_support::now());
            prop_assert!(desired.is_ok(), "{:?}", desired.err());
            let desired = desired.unwrap();
            pipeline_support::assert_cluster_accepts(&desired);
            prop_assert_eq!(desired.vcjob.spec.tasks[0].replicas as u32, job.replicas);
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Accounting ticks.

fn ts(seconds: i64) -> Timestamp {
    Timestamp::from_second(seconds).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// A job monitored at arbitrary instants and completed at its real end gets contiguous ticks from
    /// its start: ids 0..n once each, no gap, no overlap, full periods except the last, exactly one final
    /// tick, never before the start, and the last tick ends at the real end when no look came after it.
    #[test]
    fn ticks_cover_the_run_exactly(
        start in 1_600_000_000i64..1_700_000_000,
        period in 1i64..4000,
        mut looks in vec(-500i64..50_000, 0..12),
        end in -500i64..50_000,
        aligned in proptest::option::of(0i64..20),
        looks_after_end in any::<bool>(),
    ) {
        // Ends exactly on a tick boundary are the edge case; make them common.
        let end = aligned.map_or(end, |k| k * period);
        let schedule = TickSchedule::new(ts(start), SignedDuration::from_secs(period)).unwrap();
        looks.sort_unstable();
        if !looks_after_end {
            looks.retain(|l| *l <= end);
        }
        let mut cursor = TickCursor::default();
        let mut ticks: Vec<Tick> = Vec::new();
        for look in &looks {
            let mut due = schedule.due(cursor, Horizon::Running(ts(start + look)));
            ticks.extend(due.by_ref());
            cursor = due.cursor();
            // Looking again at the same instant publishes nothing.
            prop_assert!(schedule.due(cursor, Horizon::Running(ts(start + look))).next().is_none());
        }
        let mut due = schedule.due(cursor, Horizon::Ended(ts(start + end)));
        let at_completion: Vec<Tick> = due.by_ref().collect();
        cursor = due.cursor();
        ticks.extend(at_completion);
        prop_assert!(cursor.finished);
        prop_assert!(schedule.due(cursor, Horizon::Ended(ts(start + end + 1000))).next().is_none());

        // Never a zero-length tick; ids 0..n, contiguous, full periods but the last, at most one final
        // and only the last.
        for (i, tick) in ticks.iter().enumerate() {
            prop_assert_eq!(tick.sequence, i as u64);
            prop_assert!(tick.start >= ts(start));
            prop_assert!(tick.end > tick.start, "a zero-length tick: {:?}", tick);
            prop_assert!(tick.duration() <= SignedDuration::from_secs(period));
            if tick.is_final {
                prop_assert_eq!(i, ticks.len() - 1);
            }
            if i + 1 < ticks.len() {
                prop_assert_eq!(tick.duration(), SignedDuration::from_secs(period));
            }
            if let Some(next) = ticks.get(i + 1) {
                prop_assert_eq!(tick.end, next.start);
            }
        }
        if let Some(first) = ticks.first() {
            prop_assert_eq!(first.start, ts(start));
        }
        let real_end = ts(start + end.max(0));
        // A look exactly at an end that falls on a boundary charged that boundary's tick as running
        // (the view proved the job running up to its end, as one lagging by the whole settle delay
        // does); the end then adds no tick, since a tick never has zero length, and the terminal event
        // marks the end (the module documentation of the Accounting plugin).
        let charged_to_the_end = end > 0 && end % period == 0 && looks.contains(&end);
        if looks.iter().all(|l| *l <= end) {
            // Every look before the end: the ticks cover the run exactly, the last one final (but for
            // the edge above, where the last is not final).
            if charged_to_the_end {
                let last = ticks.last();
                prop_assert!(last.is_some_and(|t| t.end == real_end && !t.is_final), "{:?}", ticks);
            } else if end > 0 {
                let last = ticks.last();
                prop_assert!(last.is_some_and(|t| t.is_final && t.end == real_end), "{:?}", ticks);
            } else {
                prop_assert!(ticks.is_empty(), "nothing ran, nothing charged: {:?}", ticks);
            }
        } else if let Some(last) = ticks.last() {
            // A look after the (not yet known) end may have charged up to that look, never more; then
            // nothing more (no zero-length tick).
            let latest = ts(start + looks.iter().copied().max().unwrap_or(0).max(end.max(0)));
            prop_assert!(last.end >= real_end && last.end <= latest);
        }
    }

    /// The expiry decision: delete exactly at or after expiry; otherwise the next look is in the future,
    /// no later than the expiry, and a warning is only for a threshold already crossed.
    #[test]
    fn expiry_decision(expiry in 10_000i64..20_000, now in 0i64..30_000, thresholds in vec(1i64..5000, 0..4)) {
        let warn: Vec<SignedDuration> = thresholds.iter().map(|s| SignedDuration::from_secs(*s)).collect();
        match decide(ts(expiry), ts(now), &warn, None) {
            Decision::DeleteNow => prop_assert!(now >= expiry),
            Decision::Wait { warn: w, next_check } => {
                prop_assert!(now < expiry);
                prop_assert!(next_check > ts(now) && next_check <= ts(expiry));
                if let Some(w) = w {
                    prop_assert!(ts(expiry).duration_since(ts(now)) <= w);
                    // Sent once: the same warning is not due again.
                    let again = decide(ts(expiry), ts(now), &warn, Some((ts(expiry), w)));
                    prop_assert!(matches!(again, Decision::Wait { warn: None, .. }), "{:?}", again);
                }
            }
        }
    }
}
