//! Compiles the message contract in `proto/` with prost, and generates the proto3 JSON mapping with pbjson.
//! protoc comes from the `protoc-bin-vendored` crate, so no system protoc is needed.

use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/volcano_runner/v1/jobs.proto",
        "proto/volcano_runner/v1/events.proto",
        "proto/volcano_runner/v1/sessions.proto",
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let out = PathBuf::from(env::var("OUT_DIR")?);
    let descriptor = out.join("volcano_runner_v1_descriptor.bin");

    let mut config = prost_build::Config::new();
    config
        .protoc_executable(protoc_bin_vendored::protoc_bin_path()?)
        .file_descriptor_set_path(&descriptor)
        .compile_well_known_types()
        // Ordered maps: rendered objects and JSON output must not depend on hash order.
        .btree_map(["."])
        // Boxed: present on terminal events only, and inline it would make every JobEvent (and the
        // enums that carry one) larger for all the others.
        .boxed(".volcano_runner.v1.JobEvent.output")
        .boxed(".volcano_runner.v1.JobEvent.trace")
        // Boxed for the same reason: present on status events of waiting jobs only.
        .boxed(".volcano_runner.v1.JobEvent.pending")
        // And this: present on the answers and news of bookings only.
        .boxed(".volcano_runner.v1.JobEvent.booking")
        .extern_path(".google.protobuf", "::pbjson_types")
        .compile_protos(&protos, &["proto/"])?;

    let descriptor_bytes = std::fs::read(&descriptor)?;
    pbjson_build::Builder::new()
        .register_descriptors(&descriptor_bytes)?
        .btree_map(["."])
        .build(&[".volcano_runner.v1"])?;
    Ok(())
}
