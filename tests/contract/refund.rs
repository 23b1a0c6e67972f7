//! The refund event of the contract: the example is exactly what the monitor publishes for a lost
//! attempt, `refundableMs` is the attempt's span in milliseconds, and its id depends on the job and the
//! attempt only.

use crate::support;

use support::{read_json, root};
use volcano_runner::messages::{self, Format};

/// `schemas/examples/job-event.refund.json` is the monitor's refund event for attempt 1 of job 4819,
/// charged from 09:32:10 to 10:19:15: the same JSON (the schema checks of every example cover it), and `refundableMs` equals the
/// span (47 min 5 s).
#[test]
fn the_refund_example_is_what_the_monitor_publishes() {
    let from: jiff::Timestamp = "2026-11-22T09:32:10Z".parse().unwrap();
    let to: jiff::Timestamp = "2026-11-22T10:19:15Z".parse().unwrap();
    let event = volcano_runner::monitor::events::refund(
        "4819",
        1,
        from,
        to,
        "volcano-runner-7d9f5c6b8-x2kqp",
    );
    assert_eq!(event.refundable_ms, 2_825_000);
    assert_eq!(event.event_id, "4819/refund/1");
    let made: serde_json::Value =
        serde_json::from_slice(&messages::encode(Format::Json, &event).unwrap()).unwrap();
    let example = read_json(&root().join("schemas/examples/job-event.refund.json"));
    assert_eq!(made, example);
    // Another runner, after a crash, reports the same attempt under the same id with the same figure.
    let again = volcano_runner::monitor::events::refund("4819", 1, from, to, "another-runner");
    assert_eq!(
        (again.event_id, again.refundable_ms, again.status),
        (event.event_id, event.refundable_ms, event.status)
    );
}
