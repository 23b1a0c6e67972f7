//! `validate --config` refuses exactly what the runner refuses (issue 41, point 5): every reason a
//! runner refuses a submission on its own, before it asks the cluster anything, is driven through the
//! library check `validate` and `submit` use ([`volcano_runner::runner::refusal::submission`]) and through a
//! real runner with the same configuration, and the verdicts are compared: accepted by both (the job
//! QUEUED), or refused by both with the same reason and the same words.

use std::collections::BTreeMap;

use crate::harness;

use harness::{Harness, figlet};
use volcano_runner::config::Config;
use volcano_runner::messages::v1::{
    JobState, NetworkIpValue, ParameterValue, PortRange, Protocol, ResourceValue, SubmitJob,
    parameter_value, resource_value,
};
use volcano_runner::pipeline::plugins::network_ip::PublicIpAttach;

fn with_ip(job_id: &str, ports: Vec<PortRange>) -> SubmitJob {
    let mut job = figlet(job_id);
    job.resources.push(ResourceValue {
        value: Some(resource_value::Value::NetworkIp(NetworkIpValue {
            id: "ip-7".into(),
            ip_address: "203.0.113.7".into(),
            open_ports: ports,
        })),
    });
    job
}

fn tcp(port: u32) -> PortRange {
    PortRange {
        start: port,
        end: port,
        protocol: Protocol::Tcp as i32,
    }
}

fn font(job_id: &str, choice: parameter_value::Value) -> SubmitJob {
    let mut job = figlet(job_id);
    job.parameters.insert(
        "font".into(),
        ParameterValue {
            value: Some(choice),
        },
    );
    job
}

/// The submissions of one table, by job id: each refusal reason of the pipeline and of validation, and
/// jobs both must accept.
fn table(attach: PublicIpAttach) -> Vec<SubmitJob> {
    let tag = match attach {
        PublicIpAttach::Refuse => "rf",
        PublicIpAttach::LoadBalancer => "lb",
    };
    let id = |name: &str| format!("{tag}-{name}");
    let mut whole = figlet(&id("whole-nodes"));
    whole.exclusive_nodes = true;
    let mut no_replicas = figlet(&id("replicas"));
    no_replicas.replicas = 0;
    let mut two_ranks_ip = with_ip(&id("ip-ranks"), vec![tcp(22)]);
    two_ranks_ip.replicas = 2;
    // Traced without an output folder for its trace (and no operator folder), and with one.
    let mut traced_nowhere = figlet(&id("traced-nowhere"));
    traced_nowhere.traced = true;
    traced_nowhere.output_folder = None;
    let mut traced = figlet(&id("traced"));
    traced.traced = true;
    traced.output_folder = Some(format!("/home/alice/Jobs/{}", traced.job_id));
    vec![
        traced_nowhere,
        traced,
        // A public IP: `not_offered` under the default `attach = "refuse"`, accepted with a way.
        with_ip(&id("ip"), vec![tcp(22)]),
        // A public IP without open ports (the load balancer would be refused by Kubernetes).
        with_ip(&id("ip-no-ports"), Vec::new()),
        // More open ports than `[pipeline.public_ip] max_ports`.
        with_ip(
            &id("ip-ports"),
            vec![PortRange {
                start: 1000,
                end: 1200,
                protocol: Protocol::Tcp as i32,
            }],
        ),
        two_ranks_ip,
        // Whole nodes for a product without a configured whole-node charge.
        whole,
        no_replicas,
        // An enumeration by its option's value, as the original took it (`-O3`), and by a name that is
        // neither.
        font(
            &id("enum-value"),
            parameter_value::Value::Enumeration("slant".into()),
        ),
        font(&id("enum-text"), parameter_value::Value::Text("Big".into())),
        font(
            &id("enum-unknown"),
            parameter_value::Value::Enumeration("Gothic".into()),
        ),
        figlet(&id("plain")),
    ]
}

/// What a runner with `config` did with each job of `jobs`: `Ok` for QUEUED, `Err((reason, status))`
/// for a refusal.
async fn runner_verdicts(
    h: &Harness,
    id: &str,
    config: Config,
    jobs: &[SubmitJob],
) -> BTreeMap<String, Result<(), (String, String)>> {
    let runner = h.start_with(id, config, false);
    for job in jobs {
        h.submit(job).await;
    }
    let ids: Vec<String> = jobs.iter().map(|j| j.job_id.clone()).collect();
    let events = h
        .wait_events("every job queued or refused", |e| {
            ids.iter().all(|id| {
                e.iter().any(|c| {
                    c.message_id == format!("{id}/QUEUED")
                        || c.message_id.starts_with(&format!("{id}/rejected/"))
                })
            })
        })
        .await;
    runner.stop().await;
    ids.iter()
        .map(|id| {
            let verdict = if events
                .iter()
                .any(|c| c.message_id == format!("{id}/QUEUED"))
            {
                Ok(())
            } else {
                let e = events
                    .iter()
                    .find(|c| c.message_id.starts_with(&format!("{id}/rejected/")))
                    .and_then(|c| c.event.clone())
                    .unwrap();
                assert_eq!(e.state, JobState::Failure as i32);
                Err((e.reason, e.status))
            };
            (id.clone(), verdict)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_refuses_exactly_what_the_runner_refuses() {
    let h = Harness::new("refusals").await;
    let mut refused_reasons = std::collections::BTreeSet::new();
    let mut accepted = 0;
    for attach in [PublicIpAttach::Refuse, PublicIpAttach::LoadBalancer] {
        let mut config = h.config.clone();
        config.pipeline.public_ip.attach = attach;
        let jobs = table(attach);
        let ran = runner_verdicts(&h, &format!("runner-{attach:?}"), config.clone(), &jobs).await;
        for job in &jobs {
            let checked =
                volcano_runner::runner::refusal::submission(job, &config, jiff::Timestamp::now());
            let by_runner = &ran[&job.job_id];
            match (&checked, by_runner) {
                (Ok(()), Ok(())) => accepted += 1,
                (Err(refusal), Err((reason, status))) => {
                    assert_eq!(refusal.reason, reason, "{}: {refusal}", job.job_id);
                    assert!(
                        status.starts_with(&refusal.to_string()),
                        "{}: validate says {refusal:?}, the runner {status:?}",
                        job.job_id
                    );
                    refused_reasons.insert((attach == PublicIpAttach::Refuse, reason.clone()));
                }
                _ => panic!(
                    "{}: validate says {checked:?}, the runner {by_runner:?}",
                    job.job_id
                ),
            }
        }
        // What each verdict is, where main's `validate` said otherwise.
        let expect = |name: &str, reason: Option<&str>| {
            let id = format!(
                "{}-{name}",
                if attach == PublicIpAttach::Refuse {
                    "rf"
                } else {
                    "lb"
                }
            );
            match (&ran[&id], reason) {
                (Ok(()), None) => {}
                (Err((r, _)), Some(reason)) if r == reason => {}
                (other, _) => panic!("{id}: {other:?}, expected {reason:?}"),
            }
        };
        expect("enum-value", None);
        expect("enum-text", None);
        expect("enum-unknown", Some("invalid_field"));
        expect("whole-nodes", Some("invalid_field"));
        expect("traced-nowhere", Some("invalid_field"));
        expect("traced", None);
        let tag = if attach == PublicIpAttach::Refuse {
            "rf"
        } else {
            "lb"
        };
        let (_, status) = ran[&format!("{tag}-traced-nowhere")].clone().unwrap_err();
        assert!(
            status.contains("traced: a traced job needs an outputFolder"),
            "the refusal names the field: {status}"
        );
        if attach == PublicIpAttach::Refuse {
            expect("ip", Some("not_offered"));
            expect("ip-no-ports", Some("not_offered"));
        } else {
            expect("ip", None);
            expect("ip-no-ports", Some("invalid_field"));
            expect("ip-ports", Some("invalid_field"));
        }
    }
    // The table reaches what it means to: both kinds of refusal, and acceptances.
    assert!(
        refused_reasons.contains(&(true, "not_offered".to_owned())),
        "{refused_reasons:?}"
    );
    assert!(
        refused_reasons.contains(&(false, "invalid_field".to_owned())),
        "{refused_reasons:?}"
    );
    assert!(accepted >= 4, "{accepted}");
}
