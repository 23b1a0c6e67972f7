# shellcheck shell=bash
# Where cargo puts what it builds, for scripts that run the binary they built:
#   cargo_target_dir   prints the target directory cargo uses here (CARGO_TARGET_DIR, build.target-dir
#                      in a .cargo/config.toml, or ./target), as an absolute path.
cargo_target_dir() {
  cargo metadata --format-version 1 --no-deps --locked |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p'
}
