//! `scripts/demo`, the README's first command, run as a reader runs it (with the binary this test run
//! built, `DEMO_BIN`, instead of a second build): every example job runs to its end, also while another
//! `run --cluster sim` runs on the machine, the script says how to put the binary on the PATH, and it
//! leaves the broker as it found it: its vhost is gone afterwards and no RabbitMQ plugin was turned on.
//! Before a first (cold) build it says that the build takes minutes.

use crate::ops_common;

use std::path::Path;
use std::process::Command;

use ops_common::rabbit::{management, segment};
use ops_common::root;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_runs_every_example_to_its_end_and_leaves_the_broker_as_it_was() {
    let dir = std::env::temp_dir().join(format!("vr-demo-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let shims = dir.join("shims");
    std::fs::create_dir_all(&shims).unwrap();
    // Another `run --cluster sim` on the machine: a live process that left its simulator's address where
    // every runner with an embedded simulator leaves it (the demo's TMPDIR is `dir`). `--cluster sim` is
    // then ambiguous; the demo must find its own runner all the same.
    let addresses = dir.join("volcano-runner-embedded-sim");
    std::fs::create_dir_all(&addresses).unwrap();
    let mut other_runner = Command::new("sleep").arg("600").spawn().unwrap();
    std::fs::write(
        addresses.join(format!("{}.url", other_runner.id())),
        "http://127.0.0.1:9\n",
    )
    .unwrap();
    // Any call of rabbitmq-plugins is recorded (and refused): the demo must not change a broker's plugins.
    let calls = dir.join("plugin-calls");
    let shim = shims.join("rabbitmq-plugins");
    std::fs::write(
        &shim,
        format!("#!/bin/sh\necho \"$@\" >> '{}'\nexit 1\n", calls.display()),
    )
    .unwrap();
    Command::new("chmod")
        .args(["755", shim.to_str().unwrap()])
        .status()
        .unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_volcano-runner"));
    let vhost = format!("vr-demo-test-{}", std::process::id());
    let path = format!(
        "{}:{}",
        shims.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = tokio::task::spawn_blocking({
        let (dir, vhost) = (dir.clone(), vhost.clone());
        move || {
            Command::new(root().join("scripts/demo"))
                .current_dir(root())
                .env("PATH", path)
                .env("DEMO_BIN", bin)
                .env("DEMO_VHOST", &vhost)
                .env("DEMO_DIR", dir.join("run"))
                .env("DEMO_TIMEOUT", "300")
                .env("TMPDIR", &dir)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let _ = other_runner.kill();
    let _ = other_runner.wait();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let log = std::fs::read_to_string(dir.join("run/runner.log")).unwrap_or_default();
    assert!(
        out.status.success(),
        "scripts/demo failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- runner log\n{log}"
    );
    for job in ["4817", "4818", "4819"] {
        assert!(
            stdout.lines().any(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.get(1) == Some(&job) && w.get(2) == Some(&"SUCCESS")
            }),
            "job {job} ran to its end:\n{stdout}"
        );
    }
    assert!(
        stdout.contains(&format!(
            "export PATH=\"{}:$PATH\"",
            bin.parent().unwrap().display()
        )),
        "the demo says how to put the binary on the PATH:\n{stdout}"
    );
    assert!(
        !calls.exists(),
        "the demo ran rabbitmq-plugins: {}",
        std::fs::read_to_string(&calls).unwrap_or_default()
    );
    let (status, _) = management("GET", &format!("/api/vhosts/{}", segment(&vhost)), None).await;
    assert_eq!(status, 404, "the demo's vhost is deleted at the end");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Before a cold build (no binary yet where cargo puts it) the demo says that it takes minutes, before
/// cargo starts printing; a warm one goes on without the warning. `cargo` is a stand-in that answers
/// `metadata` with the target directory and records `build` (and fails it, which ends the demo there).
#[test]
fn the_demo_warns_before_a_cold_build_that_it_takes_minutes() {
    let dir = std::env::temp_dir().join(format!("vr-demo-cold-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (shims, target) = (dir.join("shims"), dir.join("target"));
    std::fs::create_dir_all(&shims).unwrap();
    std::fs::create_dir_all(&target).unwrap();
    let cargo = shims.join("cargo");
    std::fs::write(
        &cargo,
        format!(
            "#!/bin/sh\ncase \"$1\" in\n  metadata) echo '{{\"target_directory\":\"{}\"}}' ;;\n  build) echo 'CARGO BUILD STARTS'; exit 1 ;;\nesac\n",
            target.display()
        ),
    )
    .unwrap();
    Command::new("chmod")
        .args(["755", cargo.to_str().unwrap()])
        .status()
        .unwrap();
    let path = format!(
        "{}:{}",
        shims.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let run = || {
        let out = Command::new(root().join("scripts/demo"))
            .current_dir(root())
            .env("PATH", &path)
            .env_remove("DEMO_BIN")
            .env("DEMO_DIR", dir.join("run"))
            .output()
            .unwrap();
        assert!(!out.status.success(), "the stand-in build fails the demo");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let cold = run();
    let warned = cold
        .find("takes several minutes")
        .unwrap_or_else(|| panic!("no warning before a cold build:\n{cold}"));
    let built = cold.find("CARGO BUILD STARTS").expect("the build ran");
    assert!(warned < built, "the warning comes first:\n{cold}");
    // A binary already built: no warning.
    std::fs::create_dir_all(target.join("debug")).unwrap();
    let bin = target.join("debug/volcano-runner");
    std::fs::write(&bin, "#!/bin/sh\n").unwrap();
    Command::new("chmod")
        .args(["755", bin.to_str().unwrap()])
        .status()
        .unwrap();
    let warm = run();
    assert!(warm.contains("CARGO BUILD STARTS"), "{warm}");
    assert!(!warm.contains("takes several minutes"), "{warm}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The scripts find the binary where cargo puts it: `CARGO_TARGET_DIR` is honoured.
#[test]
fn the_scripts_find_the_target_directory_cargo_uses() {
    let run = |target: Option<&str>| {
        let mut cmd = Command::new("bash");
        cmd.args(["-c", ". scripts/lib/cargo.sh && cargo_target_dir"])
            .current_dir(root());
        match target {
            Some(t) => cmd.env("CARGO_TARGET_DIR", t),
            None => cmd.env_remove("CARGO_TARGET_DIR"),
        };
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    assert_eq!(
        run(Some("/tmp/vr-elsewhere")),
        "/tmp/vr-elsewhere",
        "CARGO_TARGET_DIR"
    );
    assert!(run(None).ends_with("target"), "the default");
}
