//! `volcano-runner validate` and `--version`, run as the built binary.

use crate::support;

use std::path::PathBuf;
use std::process::{Command, Output};

use volcano_runner::messages::{self, Format, MessageType};

use support::root;

/// The binary with a clean environment, run from the repository root.
fn volcano_runner(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_volcano-runner"))
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .current_dir(root())
        .output()
        .expect("the binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn example_paths() -> Vec<String> {
    support::examples()
        .into_iter()
        .map(|(p, _)| p.strip_prefix(root()).unwrap().display().to_string())
        .collect()
}

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("volcano-runner-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `validate schemas/examples/*.json` with the test configuration prints `<file>: ok` for each and
/// exits 0.
#[test]
fn examples_are_ok() {
    let files = example_paths();
    let mut args = vec!["validate", "--config", "tests/fixtures/config.toml"];
    args.extend(files.iter().map(String::as_str));
    let out = volcano_runner(&args, &[]);
    let lines: Vec<String> = files.iter().map(|f| format!("{f}: ok")).collect();
    assert_eq!(stdout(&out), lines.join("\n") + "\n");
    assert_eq!(out.status.code(), Some(0));
}

/// `validate` gives the verdict `submit` (and a runner) gives, with and without a configuration: the
/// MATLAB example names a license server, so without one configured both refuse it with the same words.
#[test]
fn validate_and_submit_agree_on_every_example_submission() {
    let submissions: Vec<String> = example_paths()
        .into_iter()
        .filter(|p| p.contains("submit-job."))
        .collect();
    assert!(submissions.len() >= 3, "{submissions:?}");
    let mut refused_somewhere = false;
    for config in [None, Some("tests/fixtures/config.toml")] {
        for file in &submissions {
            let mut validate = vec!["validate"];
            let mut submit = vec!["submit"];
            if let Some(config) = config {
                validate.extend(["--config", config]);
                submit.extend(["--config", config]);
            }
            validate.push(file);
            submit.push(file);
            // No broker listens here: a valid submission fails at the connection, an invalid one before.
            let env = [
                (
                    "VOLCANO_RUNNER_BROKER__URL",
                    "amqp://guest:guest@127.0.0.1:9/%2f",
                ),
                ("VOLCANO_RUNNER_BROKER__STARTUP_TIMEOUT", "1s"),
            ];
            let checked = volcano_runner(&validate, &env);
            let sent = volcano_runner(&submit, &env);
            let verdict = stdout(&checked);
            let submit_err = String::from_utf8_lossy(&sent.stderr).into_owned();
            let valid = checked.status.success();
            assert_eq!(
                verdict.trim_end() == format!("{file}: ok"),
                valid,
                "{config:?} {file}: {verdict}"
            );
            let refused = submit_err.contains(&format!("{file}: invalid: "));
            assert_eq!(
                refused, !valid,
                "{config:?} {file}: validate says {verdict:?}, submit says {submit_err:?}"
            );
            if refused {
                refused_somewhere = true;
                let problem = verdict
                    .trim_end()
                    .strip_prefix(&format!("{file}: "))
                    .unwrap();
                assert!(
                    submit_err.contains(problem),
                    "{config:?} {file}: the same words: {problem:?} vs {submit_err:?}"
                );
            }
        }
    }
    assert!(
        refused_somewhere,
        "the MATLAB example without a license configured is refused by both"
    );
}

/// With a configuration that lacks the license, the same example is invalid.
#[test]
fn unknown_license_with_configuration() {
    let dir = scratch("license");
    let config = dir.join("runner.toml");
    std::fs::write(&config, "[limits]\nmax_replicas = 4\n").unwrap();
    let out = volcano_runner(
        &["validate", "schemas/examples/submit-job.matlab-web.json"],
        &[("VOLCANO_RUNNER_CONFIG", config.to_str().unwrap())],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).starts_with(
            "schemas/examples/submit-job.matlab-web.json: parameters.license.licenseServer.id: unknown license server \"matlab-campus\""
        ),
        "{}",
        stdout(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// One broken file among good ones: every file gets its line, the broken one names the field, and the
/// exit code is 1.
#[test]
fn a_broken_copy_exits_non_zero_naming_the_field() {
    let out = volcano_runner(
        &[
            "validate",
            "schemas/examples/cancel-job.json",
            "tests/fixtures/invalid/submit-job.dotdot-mount.json",
            "schemas/examples/extend-job.json",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[0], "schemas/examples/cancel-job.json: ok");
    assert!(
        lines[1].starts_with(
            "tests/fixtures/invalid/submit-job.dotdot-mount.json: resources[0].file.path: "
        ),
        "{text}"
    );
    assert_eq!(lines[2], "schemas/examples/extend-job.json: ok");
}

/// Protobuf files: the format from the extension or --format, the type from the name or --type.
#[test]
fn protobuf_files() {
    let dir = scratch("protobuf");
    let json = std::fs::read(root().join("schemas/examples/submit-job.figlet.json")).unwrap();
    let job: messages::v1::SubmitJob = messages::decode(Format::Json, &json).unwrap();
    let by_name = dir.join("submit-job.figlet.binpb");
    std::fs::write(&by_name, messages::encode(Format::Protobuf, &job).unwrap()).unwrap();
    let anonymous = dir.join("message.dat");
    let mut broken = job.clone();
    broken.replicas = 0;
    std::fs::write(
        &anonymous,
        messages::encode(Format::Protobuf, &broken).unwrap(),
    )
    .unwrap();

    let out = volcano_runner(&["validate", by_name.to_str().unwrap()], &[]);
    assert_eq!(stdout(&out), format!("{}: ok\n", by_name.display()));

    let out = volcano_runner(
        &[
            "validate",
            "--format",
            "protobuf",
            "--type",
            "SubmitJob",
            anonymous.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stdout(&out),
        format!("{}: replicas: must be at least 1\n", anonymous.display())
    );

    // Without --type the message type is unknown; without --format so is the format.
    let out = volcano_runner(&["validate", anonymous.to_str().unwrap()], &[]);
    assert!(
        stdout(&out).contains("cannot tell the message type"),
        "{}",
        stdout(&out)
    );
    let out = volcano_runner(
        &[
            "validate",
            "--type",
            "submit-job",
            anonymous.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        stdout(&out).contains("cannot tell the format"),
        "{}",
        stdout(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bad configuration stops the command before any file is read, naming the key and the variable.
#[test]
fn bad_configuration_stops_with_the_key() {
    let out = volcano_runner(
        &["validate", "schemas/examples/cancel-job.json"],
        &[("VOLCANO_RUNNER_LIMITS__MAX_REPLICAS", "many")],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(stdout(&out).is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("configuration limits.max_replicas: ")
            && stderr.contains("VOLCANO_RUNNER_LIMITS__MAX_REPLICAS"),
        "{stderr}"
    );
}

/// The limit on replicas comes from the configuration, here from the environment.
#[test]
fn replica_limit_from_the_environment() {
    let out = volcano_runner(
        &["validate", "schemas/examples/submit-job.mpi-2-nodes.json"],
        &[("VOLCANO_RUNNER_LIMITS__MAX_REPLICAS", "1")],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("replicas: 2 replicas asked for, at most 1"),
        "{}",
        stdout(&out)
    );
}

/// `--version` prints the crate version.
#[test]
fn version() {
    let out = volcano_runner(&["--version"], &[]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        stdout(&out),
        format!("volcano-runner {}\n", env!("CARGO_PKG_VERSION"))
    );
}

/// Every message type the CLI can be told about by name.
#[test]
fn type_names_parse() {
    for t in MessageType::ALL {
        let out = volcano_runner(
            &[
                "validate",
                "--type",
                t.name(),
                "--format",
                "json",
                "/nonexistent/x",
            ],
            &[],
        );
        assert!(stdout(&out).contains("cannot read"), "{}", stdout(&out));
    }
}

/// One configuration, checked once, for every command: a bad value in the `[pipeline]`, `[cluster]`,
/// `[monitor]` or `[sim]` section (here set through the environment, which every command honours) stops
/// each command at start, naming the key, before it touches a broker or a cluster.
#[test]
fn every_command_refuses_a_bad_value_in_every_section_naming_the_key() {
    let figlet = "schemas/examples/submit-job.figlet.json";
    let commands: Vec<Vec<&str>> = vec![
        vec!["run", "--cluster", "http://127.0.0.1:9"],
        vec!["render", figlet],
        vec!["sim", "--listen", "127.0.0.1:0"],
        vec!["validate", figlet],
        vec!["submit", figlet],
        vec!["cancel", "4817"],
        vec!["extend", "4817", "30m"],
        vec!["events"],
        vec!["admin", "--cluster", "http://127.0.0.1:9", "status"],
    ];
    let bad = [
        (
            "VOLCANO_RUNNER_PIPELINE__ANNOTATION_PREFIX",
            "ucloud.dk",
            "pipeline.annotation_prefix",
        ),
        (
            "VOLCANO_RUNNER_CLUSTER__NAMESPACE",
            "Not_A_Name",
            "cluster.namespace",
        ),
        (
            "VOLCANO_RUNNER_MONITOR__RECONCILE_INTERVAL",
            "100ms",
            "monitor.reconcile_interval",
        ),
        ("VOLCANO_RUNNER_SIM__CLOCK_SPEED", "-1", "sim.clock_speed"),
    ];
    for args in &commands {
        for (name, value, key) in bad {
            let out = volcano_runner(args, &[(name, value)]);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success(),
                "{args:?} with {name}={value} did not stop: {}",
                stdout(&out)
            );
            assert!(
                stderr.contains(key),
                "{args:?} with {name}={value}: the error does not name {key}: {stderr}"
            );
        }
    }
}

/// An operator command pointed at a cluster that is not there says so at once (no retry budget), with
/// the address and what to do, and without the client library's own error lines.
#[test]
fn an_unreachable_cluster_is_named_at_once() {
    let out = volcano_runner(&["admin", "--cluster", "http://127.0.0.1:9", "status"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("cannot reach the cluster at http://127.0.0.1:9/"),
        "{stderr}"
    );
    assert!(stderr.contains("Point --cluster"), "{stderr}");
    assert!(!stderr.contains("kube_client"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        !stderr.contains("attempts"),
        "no retry budget spent: {stderr}"
    );
}

/// What a runner refuses, `validate` refuses, and so does `render` (the runner's validation and
/// pipeline), naming the same field by its JSON path: peer host names that are no Service name (dots,
/// `j-`, a leading digit), an opened file outside every mounted folder, a time allocation over 100
/// years, an image reference over 512 characters, an environment variable name over 256. (The schema's
/// verdict on each is held in tests/fixtures/invalid/index.toml.) The pipeline on its own, unvalidated,
/// refuses the peer host names, the opened file and the time allocations under the same names.
#[test]
fn validate_and_render_refuse_what_the_runner_refuses_naming_the_same_field() {
    let cases = [
        (
            "submit-job.peer-hostname-with-dots.json",
            "parameters.database.peer.hostname",
        ),
        (
            "submit-job.peer-hostname-j-prefix.json",
            "parameters.database.peer.hostname",
        ),
        (
            "submit-job.peer-hostname-leading-digit.json",
            "parameters.database.peer.hostname",
        ),
        ("submit-job.opened-file-not-mounted.json", "openedFile"),
        (
            "submit-job.time-allocation-over-100-years.json",
            "timeAllocation",
        ),
        (
            "submit-job.time-allocation-10000-years.json",
            "timeAllocation",
        ),
        ("submit-job.image-too-long.json", "application.image"),
    ];
    let long_env = format!("application.environment.{}", "L".repeat(257));
    let cases = cases.into_iter().chain([(
        "submit-job.environment-name-too-long.json",
        long_env.as_str(),
    )]);
    let test_config = crate::support::test_config();
    for (name, field) in cases {
        let file = format!("tests/fixtures/invalid/{name}");
        if !name.contains("too-long") {
            let job: messages::v1::SubmitJob =
                messages::decode(Format::Json, &std::fs::read(root().join(&file)).unwrap())
                    .unwrap();
            let e =
                volcano_runner::pipeline::render(&job, &test_config, jiff::Timestamp::UNIX_EPOCH)
                    .unwrap_err();
            assert_eq!(e.field(), field, "{file}: the pipeline says {e}");
        }
        let config = ["--config", "tests/fixtures/config.toml"];
        let checked = volcano_runner(&[&["validate"][..], &config, &[&file]].concat(), &[]);
        assert_eq!(
            checked.status.code(),
            Some(1),
            "{file}: {}",
            stdout(&checked)
        );
        assert!(
            stdout(&checked).starts_with(&format!("{file}: {field}: ")),
            "{}",
            stdout(&checked)
        );
        let rendered = volcano_runner(&[&["render"][..], &config, &[&file]].concat(), &[]);
        let stderr = String::from_utf8_lossy(&rendered.stderr);
        assert_eq!(rendered.status.code(), Some(1), "{file}: {stderr}");
        assert!(
            stderr.starts_with(&format!("{file}: {field}: ")),
            "{stderr}"
        );
    }
}

/// `logs` takes a job id by the runner's rule, so it cannot add terms to the field selector it looks the
/// job up with, and a namespace that is a namespace name, so the URL path cannot be bent; both are
/// refused before any cluster is contacted, naming the argument.
#[test]
fn logs_refuses_a_job_id_or_namespace_that_is_not_a_name() {
    for (args, argument, words) in [
        (
            vec!["4817,metadata.namespace=kube-system"],
            "<JOB_ID>",
            "lower-case letters, digits and '-'",
        ),
        (vec!["Job 1"], "<JOB_ID>", "lower-case letters"),
        (
            vec!["4817", "--namespace", "../../apis/x"],
            "--namespace",
            "not a namespace name",
        ),
        (
            vec!["4817", "--namespace", "apps%2Fx"],
            "--namespace",
            "not a namespace name",
        ),
    ] {
        let mut all = vec!["logs", "--cluster", "http://127.0.0.1:9"];
        all.extend(args.iter().copied());
        let out = volcano_runner(&all, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(argument) && stderr.contains(words),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("cannot reach"), "{args:?}: {stderr}");
    }
}

/// `validate --config` refuses what the runner with that configuration refuses when it renders the job
/// (issue 41, point 5): a public IP under `attach = "refuse"` is refused with the runner's words, and
/// with `attach = "load-balancer"` one without open ports is; whole nodes without a configured charge
/// are refused; an enumeration given by its option's value (`slant` for `Slant`, as the original took
/// `-O3`) is ok. On main `validate` said ok to the first three and refused the last.
#[test]
fn validate_refuses_what_rendering_refuses_and_takes_an_option_by_value() {
    use messages::v1::{
        NetworkIpValue, ParameterValue, PortRange, Protocol, ResourceValue, parameter_value,
        resource_value,
    };
    let dir = scratch("render");
    let json = std::fs::read(root().join("schemas/examples/submit-job.figlet.json")).unwrap();
    let figlet: messages::v1::SubmitJob = messages::decode(Format::Json, &json).unwrap();
    let write = |name: &str, job: &messages::v1::SubmitJob| {
        let path = dir.join(format!("submit-job.{name}.json"));
        std::fs::write(&path, messages::encode(Format::Json, job).unwrap()).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let with_ip = |ports: Vec<PortRange>| {
        let mut job = figlet.clone();
        job.resources.push(ResourceValue {
            value: Some(resource_value::Value::NetworkIp(NetworkIpValue {
                id: "ip-7".into(),
                ip_address: "203.0.113.7".into(),
                open_ports: ports,
            })),
        });
        job
    };
    let ip = write(
        "ip",
        &with_ip(vec![PortRange {
            start: 22,
            end: 22,
            protocol: Protocol::Tcp as i32,
        }]),
    );
    let no_ports = write("no-ports", &with_ip(Vec::new()));
    let mut whole = figlet.clone();
    whole.exclusive_nodes = true;
    let whole = write("whole", &whole);
    let mut by_value = figlet.clone();
    by_value.parameters.insert(
        "font".into(),
        ParameterValue {
            value: Some(parameter_value::Value::Enumeration("slant".into())),
        },
    );
    let by_value = write("by-value", &by_value);
    let refuse = dir.join("refuse.toml");
    std::fs::write(&refuse, "").unwrap();
    let lb = dir.join("lb.toml");
    std::fs::write(&lb, "[pipeline.public_ip]\nattach = \"load-balancer\"\n").unwrap();

    let run = |config: &std::path::Path, file: &str| {
        let out = volcano_runner(
            &["validate", "--config", config.to_str().unwrap(), file],
            &[],
        );
        (out.status.code(), stdout(&out))
    };
    let (code, text) = run(&refuse, &ip);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.starts_with(&format!(
            "{ip}: resources[0].networkIp: public IPs are not offered on this cluster"
        )),
        "{text}"
    );
    let (code, text) = run(&lb, &ip);
    assert_eq!(
        (code, text.trim_end()),
        (Some(0), format!("{ip}: ok").as_str())
    );
    let (code, text) = run(&lb, &no_ports);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.starts_with(&format!(
            "{no_ports}: resources[0].networkIp.openPorts: a public IP needs at least one open port"
        )),
        "{text}"
    );
    let (code, text) = run(&refuse, &whole);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.starts_with(&format!(
            "{whole}: exclusiveNodes: whole nodes are not offered for product"
        )),
        "{text}"
    );
    let (code, text) = run(&refuse, &by_value);
    assert_eq!(
        (code, text.trim_end()),
        (Some(0), format!("{by_value}: ok").as_str())
    );
    let _ = std::fs::remove_dir_all(&dir);
}
