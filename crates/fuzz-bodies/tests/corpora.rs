//! Every committed fuzz input, replayed: the corpus each target grew
//! (`fuzz/corpus/<target>/`) and the inputs that once found a defect
//! (`fuzz/regressions/<target>/`), so that CI keeps what fuzzing found.

use std::path::PathBuf;

fn fuzz_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

#[test]
fn every_committed_input_passes_its_target() {
    let mut replayed = 0;
    for (target, body) in rate_tier_fuzz_bodies::TARGETS {
        let mut inputs = 0;
        for kind in ["corpus", "regressions"] {
            let dir = fuzz_dir().join(kind).join(target);
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries {
                let path = entry.expect("an entry").path();
                let data = std::fs::read(&path).expect("an input");
                let outcome = std::panic::catch_unwind(|| body(&data));
                assert!(outcome.is_ok(), "{target}: {} fails", path.display());
                inputs += 1;
            }
        }
        assert!(inputs > 0, "{target}: no committed input to replay");
        replayed += inputs;
    }
    println!("replayed {replayed} fuzz inputs");
}
