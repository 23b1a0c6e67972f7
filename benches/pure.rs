//! The pure steps every message and every monitored job goes through, one group each:
//! - `decode_validate`: a SubmitJob's bytes to a checked message (AMQP type and content type, decoding,
//!   validation), for the figlet and the two-node MPI examples, in JSON and protobuf;
//! - `ticks`: accounting tick computation, the common case of one due tick per pass and a day's backlog
//!   (1,440 one-minute ticks after a monitor outage), each tick turned into its message;
//! - `estimate`: start-time estimates for 10,000 pending jobs (single ranks and gangs of 2 to 8, CPU and
//!   GPU products) over 1,000 full nodes with 4,000 running jobs ending over the next day;
//! - `listing`: reading one page of a metadata list (500 VolcanoJobs with the annotations the runner
//!   writes, as the simulator and an API server send it) for names and versions, as every
//!   reconciliation pass does for every watched object.
//!
//! Run with `cargo bench --bench pure`; render throughput has its own bench (`render`).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use jiff::{SignedDuration, Timestamp};
use volcano_runner::config::Config;
use volcano_runner::durable::AnnotationKeys;
use volcano_runner::messages::v1::SubmitJob;
use volcano_runner::messages::{Format, Inbound, MessageType, decode, decode_inbound, encode};
use volcano_runner::pipeline::hooks::JobFacts;
use volcano_runner::pipeline::{Horizon, TickCursor, TickSchedule};
use volcano_runner::validate;

fn example(name: &str) -> SubmitJob {
    let path = format!(
        "{}/schemas/examples/submit-job.{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read(&path).expect("example file");
    decode(Format::Json, &text).expect("a SubmitJob")
}

fn decode_validate(c: &mut Criterion) {
    let config = Config::default();
    let mut group = c.benchmark_group("decode_validate");
    group.throughput(Throughput::Elements(1));
    for name in ["figlet", "mpi-2-nodes"] {
        let job = example(name);
        for format in Format::ALL {
            let body = encode(format, &job).expect("encodes");
            let content_type = format.content_type();
            let check = |body: &[u8]| {
                let Inbound::Submit(job) = decode_inbound(
                    Some(MessageType::SubmitJob.amqp_type()),
                    Some(content_type),
                    body,
                )
                .expect("decodes") else {
                    panic!("not a submission")
                };
                validate::submit(&job, &config).expect("valid");
                job
            };
            check(&body);
            let id = format!("{name}/{}", format!("{format:?}").to_lowercase());
            group.bench_function(id, |b| b.iter(|| check(black_box(&body))));
        }
    }
    group.finish();
}

fn ticks(c: &mut Criterion) {
    let start: Timestamp = "2026-11-22T09:00:00Z".parse().expect("timestamp");
    let schedule = TickSchedule::new(start, SignedDuration::from_secs(60)).expect("a schedule");
    // The facts as the monitor reads them from a rendered VolcanoJob.
    let config = Config::default();
    let desired =
        volcano_runner::pipeline::render(&example("figlet"), &config, start).expect("renders");
    let keys = AnnotationKeys::new(&config.pipeline.annotation_prefix);
    let facts = JobFacts::read(&desired.vcjob, &keys, &config).expect("facts");
    let mut group = c.benchmark_group("ticks");
    // A job in its 10th hour; the monitor last published tick 599, and tick 600 is now complete.
    let cursor = TickCursor {
        next: 600,
        finished: false,
    };
    let now = start + SignedDuration::from_secs(601 * 60 + 5);
    assert_eq!(schedule.due(cursor, Horizon::Running(now)).count(), 1);
    group.throughput(Throughput::Elements(1));
    group.bench_function("one_due", |b| {
        b.iter(|| {
            schedule
                .due(black_box(cursor), Horizon::Running(black_box(now)))
                .map(|t| t.to_message(&facts))
                .collect::<Vec<_>>()
        })
    });
    // A day without a monitor, then the job ended: 1,440 ticks, the last one final.
    let ended = start + SignedDuration::from_secs(24 * 3600);
    let backlog = schedule
        .due(TickCursor::default(), Horizon::Ended(ended))
        .count();
    assert_eq!(backlog, 1440);
    group.throughput(Throughput::Elements(backlog as u64));
    group.bench_function("day_backlog", |b| {
        b.iter(|| {
            schedule
                .due(
                    black_box(TickCursor::default()),
                    Horizon::Ended(black_box(ended)),
                )
                .map(|t| t.to_message(&facts))
                .collect::<Vec<_>>()
        })
    });
    group.finish();
}

fn estimates(c: &mut Criterion) {
    use volcano_runner::forecast::{Node, Pending, Resources, Running, estimate};
    let now = Timestamp::from_second(1_800_000_000).unwrap();
    let res = |cpu: u64, gpu: u64| Resources {
        cpu_milli: cpu * 1000,
        memory_mib: cpu * 4096,
        gpu,
    };
    let nodes: Vec<Node> = (0..1000)
        .map(|i| Node {
            name: format!("node-{i}"),
            allocatable: if i % 10 == 0 { res(64, 4) } else { res(64, 0) },
            reserved_for: None,
        })
        .collect();
    // Every node full: four running jobs of 16 CPUs each, ending at spread instants over a day.
    let running: Vec<Running> = (0..4000)
        .map(|i| Running {
            ranks: vec![(i / 4, res(16, if (i / 4) % 10 == 0 { 1 } else { 0 }))],
            ends_by: Some(now + SignedDuration::from_secs(((i * 7919) % 86_400) as i64)),
        })
        .collect();
    let pending: Vec<Pending> = (0..10_000u32)
        .map(|i| Pending {
            exclusive: false,
            job_id: format!("p-{i}"),
            replicas: if i % 5 == 0 { 2 + i % 7 } else { 1 },
            per_rank: res(u64::from(1 + i % 16), u64::from(i % 23 == 0)),
            runs_for: Some(SignedDuration::from_secs(600 + i64::from(i % 48) * 300)),
            queue: format!("q-{}", i % 3),
            fifo: false,
            reserved_from: None,
            inqueue: true,
            reserves: None,
            gives_up_at: None,
        })
        .collect();
    let mut group = c.benchmark_group("estimate");
    group.throughput(Throughput::Elements(pending.len() as u64));
    group.sample_size(20);
    group.bench_function("10000_pending_1000_nodes", |b| {
        b.iter(|| {
            estimate(
                black_box(&nodes),
                black_box(&running),
                black_box(&pending),
                now,
            )
        })
    });
    group.finish();
}

fn listing(c: &mut Criterion) {
    use volcano_runner::monitor::listing;
    // The metadata of a running figlet job as an API server lists it (keys in the order Go writes
    // them: identity, then labels and annotations, then finalizers).
    let item = |i: usize| {
        format!(
            r#"{{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadata","metadata":{{"name":"j-b{i}","namespace":"bench","uid":"7476cf8a-4baa-4dc0-8ca8-{i:012}","resourceVersion":"{rv}","generation":1,"creationTimestamp":"2026-11-25T20:40:47Z","labels":{{"app.kubernetes.io/managed-by":"volcano-runner"}},"annotations":{{"ucloud.dk/acceptedAt":"1795334400000","ucloud.dk/accountingPeriodMs":"60000","ucloud.dk/application":"figlet@1.0.0","ucloud.dk/expiry":"1795338000000","ucloud.dk/jobStart":"1795334400000","ucloud.dk/lifecycleState":"RUNNING","ucloud.dk/maxTime":"3600000","ucloud.dk/ownerUser":"alice","ucloud.dk/productCategory":"u1-standard","ucloud.dk/productCpu":"1","ucloud.dk/productGpu":"0","ucloud.dk/productId":"u1-standard-1","ucloud.dk/productMemoryGib":"4","ucloud.dk/replicas":"1","ucloud.dk/submissionHash":"sha256:564dc0dde5a82ea40f9d134a5c93bf281efb411addef69585ef1bc4b1e39a75e","ucloud.dk/user":"alice"}},"finalizers":["ucloud.dk/cleanup"]}}}}"#,
            rv = 1000 + i * 7
        )
    };
    let items: Vec<String> = (0..500).map(item).collect();
    let page = format!(
        r#"{{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadataList","metadata":{{"continue":"9000/bench/j-b499","resourceVersion":"9000"}},"items":[{}]}}"#,
        items.join(",")
    );
    let count = || {
        let mut n = 0usize;
        listing::read(black_box(page.as_bytes()), |o| {
            n += usize::from(o.resource_version.is_some());
        })
        .expect("the page reads");
        n
    };
    assert_eq!(count(), 500);
    let mut group = c.benchmark_group("listing");
    group.throughput(Throughput::Bytes(page.len() as u64));
    group.bench_function("page_of_500_jobs", |b| b.iter(count));
    group.finish();
}

criterion_group!(benches, decode_validate, ticks, estimates, listing);
criterion_main!(benches);
