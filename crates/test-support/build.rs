//! Builds the fake clock's preload library (`src/fake_clock.c`, see
//! `src/fake_clock.rs`) into `OUT_DIR`, with the target's C compiler as
//! the `cc` crate finds it (`$CC`, else `cc`: on Linux, the one rustc links
//! with), and tells the crate where it
//! is (`TRT_FAKE_CLOCK_LIB`) or why there is none (`TRT_FAKE_CLOCK_ERROR`).
//! A failure here fails no build: only the tests that need a fake clock
//! fail, with the reason.

use std::env;
use std::path::PathBuf;

const SOURCE: &str = "src/fake_clock.c";

fn main() {
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-env-changed=CC");
    match build() {
        Ok(lib) => {
            println!("cargo:rustc-env=TRT_FAKE_CLOCK_LIB={}", lib.display())
        }
        Err(why) => {
            // One line: a rustc-env value ends at the line's end.
            let why = why.replace(['\r', '\n'], " ");
            println!("cargo:rustc-env=TRT_FAKE_CLOCK_ERROR={why}");
        }
    }
}

fn build() -> Result<PathBuf, String> {
    if env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return Err(
            "the fake clock is a Linux LD_PRELOAD library; this is not Linux"
                .to_owned(),
        );
    }
    let out = PathBuf::from(env::var_os("OUT_DIR").ok_or("no OUT_DIR")?)
        .join("libtrt_fake_clock.so");
    // The cc crate finds the target's C compiler ($CC, $TARGET_CC, cc);
    // it builds static libraries, so the shared object is linked here.
    let compiler = cc::Build::new()
        .cargo_metadata(false)
        .try_get_compiler()
        .map_err(|e| format!("no C compiler to build {SOURCE}: {e}"))?;
    let cc = compiler.path().display().to_string();
    let output = compiler
        .to_command()
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-o"])
        .arg(&out)
        .arg(SOURCE)
        .output()
        .map_err(|e| {
            format!(
                "could not run the C compiler `{cc}` to build {SOURCE}: {e}"
            )
        })?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        let why = format!("`{cc}` could not build {SOURCE}: {stderr}");
        println!("cargo:warning={}", why.replace(['\r', '\n'], " "));
        return Err(why);
    }
    if !stderr.trim().is_empty() {
        println!(
            "cargo:warning={SOURCE}: {}",
            stderr.replace(['\r', '\n'], " ")
        );
    }
    Ok(out)
}
