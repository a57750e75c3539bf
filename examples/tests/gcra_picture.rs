//! `gcra_picture` draws the README's "why GCRA" SVG with the counts the
//! post's `fixed_window` prints (`examples/expected/fixed_window.txt`):
//! the fixed window lets all 20 requests through, GCRA 10.
#![allow(clippy::unwrap_used)]

mod support;

use std::process::Command;

use support::example_bin;

/// How many requests `fixed_window` says each algorithm allowed, from its
/// expected output (`fixed window: 20 of 20 allowed in 2 seconds`).
fn expected_allowed() -> (usize, usize) {
    let allowed = |prefix: &str| {
        let line = include_str!("../expected/fixed_window.txt")
            .lines()
            .find(|line| line.starts_with(prefix))
            .unwrap();
        let rest = line[prefix.len()..].trim_start();
        rest.split(' ').next().unwrap().parse().unwrap()
    };
    (allowed("fixed window:"), allowed("GCRA:"))
}

/// `<circle` elements of `svg` filled with `fill` (`#RRGGBB`).
fn dots(svg: &str, fill: &str) -> usize {
    svg.split("<circle")
        .skip(1)
        .filter(|circle| circle.contains(&format!("fill=\"{fill}\"")))
        .count()
}

#[test]
fn the_picture_shows_each_request_as_the_limiter_decided_it() {
    let dir = std::env::temp_dir()
        .join(format!("gcra-picture-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // A folder that does not exist yet: the example makes it.
    let path = dir.join("docs").join("why-gcra.svg");
    let output = Command::new(example_bin("gcra_picture"))
        .arg(&path)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();

    let (fixed, gcra) = expected_allowed();
    assert_eq!((fixed, gcra), (20, 10));
    assert_eq!(
        stdout,
        format!(
            "fixed window: {fixed} of 20 allowed; most in any 60 s: 20\n\
             GCRA:         {gcra} of 20 allowed; most in any 60 s: 10\n\
             wrote {}\n",
            path.display()
        )
    );

    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.starts_with("<svg"), "{svg}");
    assert!(
        svg.contains("Fixed window: 20 of 20 allowed; most in any 60 s: 20"),
        "{svg}"
    );
    assert!(
        svg.contains(
            "GCRA (tower-rate-tier): 10 of 20 allowed; most in any 60 s: 10"
        ),
        "{svg}"
    );
    // GCRA's first refusal waits 5 s: 10 per minute is one every 6 s.
    assert!(svg.contains("65 s: the next may pass (retry-after 5 s)"));
    // A dot per request, and one of each colour in the legend.
    let (allowed, refused) = ("#2E7D32", "#C62828");
    assert_eq!(dots(&svg, allowed), fixed + gcra + 1);
    assert_eq!(dots(&svg, refused), (20 - fixed) + (20 - gcra) + 1);
    std::fs::remove_dir_all(&dir).unwrap();
}
