//! The config: what envoyproxy/ratelimit accepts is accepted, what it
//! refuses is refused with its message, naming the file (and the line).
//! Every config here is written for these tests.

mod support;

use std::process::Command;

use rate_tier_service::Config;
use support::TempDir;

fn valid(yaml: &str) -> Config {
    Config::from_yaml("c.yaml", yaml)
        .unwrap_or_else(|e| panic!("{yaml}\nrefused: {e}"))
}

fn invalid(yaml: &str) -> String {
    match Config::from_yaml("c.yaml", yaml) {
        Ok(_) => panic!("{yaml}\naccepted"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn upstream_accepts_these_and_so_do_we() {
    for yaml in [
        // A domain with no rules: it exists, nothing is limited.
        "domain: d\n",
        "domain: d\ndescriptors:\n",
        "domain: d\ndescriptors: []\n",
        // Nesting, values, wildcards anywhere in the value.
        "domain: d\ndescriptors:\n  - key: a\n    value: b\n    descriptors:\n      - key: c\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
        "domain: d\ndescriptors:\n  - key: p\n    value: /api/*/items\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
        "domain: d\ndescriptors:\n  - key: p\n    value: a*b*c\n    share_threshold: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
        // A limit and children on one node.
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n    descriptors:\n      - key: b\n        rate_limit: {unit: hour, requests_per_unit: 2}\n",
        // A whitelist entry: neither a limit nor children.
        "domain: d\ndescriptors:\n  - key: a\n    value: b\n",
        // Units in any case, every unit.
        "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: SECOND, requests_per_unit: 1}}\n  - {key: b, rate_limit: {unit: Minute, requests_per_unit: 1}}\n  - {key: c, rate_limit: {unit: hour, requests_per_unit: 1}}\n  - {key: e, rate_limit: {unit: day, requests_per_unit: 1}}\n  - {key: f, rate_limit: {unit: week, requests_per_unit: 1}}\n  - {key: g, rate_limit: {unit: month, requests_per_unit: 1}}\n  - {key: h, rate_limit: {unit: year, requests_per_unit: 4294967295}}\n",
        // 0, absent (0), and the largest count.
        "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: second, requests_per_unit: 0}}\n  - {key: b, rate_limit: {unit: second}}\n  - {key: c, rate_limit: {unit: second, requests_per_unit: 4294967295}}\n",
        // Unlimited without a unit, and (an upstream quirk) with an invalid one.
        "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unlimited: true}}\n  - {key: b, rate_limit: {unlimited: true, unit: foo}}\n  - {key: c, rate_limit: {unlimited: true, requests_per_unit: 5}}\n",
        // `rate_limit:` null is no limit; `value: ~` is key-only.
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n  - key: b\n    value: ~\n",
        // Scalars read as text: `value: 200`, `value: yes`, `value: 1.5`.
        "domain: d\ndescriptors:\n  - {key: code, value: 200, rate_limit: {unit: second, requests_per_unit: 1}}\n  - {key: flag, value: yes}\n  - {key: f, value: 1.5}\n",
        // YAML 1.1 booleans, null booleans.
        "domain: d\ndescriptors:\n  - {key: a, shadow_mode: yes, rate_limit: {unit: second, requests_per_unit: 1}}\n  - {key: b, shadow_mode: Off}\n  - {key: c, shadow_mode: ~}\n",
        // YAML 1.1 integers.
        "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: second, requests_per_unit: 010}}\n  - {key: b, rate_limit: {unit: second, requests_per_unit: 0x10}}\n  - {key: c, rate_limit: {unit: second, requests_per_unit: 1_000}}\n",
        // Names: repeated across rules, replaces of a name nobody has.
        "domain: d\ndescriptors:\n  - {key: a, rate_limit: {name: n, unit: second, requests_per_unit: 1}}\n  - {key: b, rate_limit: {name: n, unit: second, requests_per_unit: 1, replaces: [{name: ghost}]}}\n",
        // The other documented keys.
        "domain: d\ndescriptors:\n  - key: a\n    quota_mode: true\n    detailed_metric: true\n    value_to_metric: true\n    metadata: {team: x, nested: {list: [1, 2], any_key: yes}}\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        // Keys and values with `_` and `.`, the same key with several values.
        "domain: d.e_f\ndescriptors:\n  - {key: a_b, value: c.d}\n  - {key: a, value: b}\n  - {key: a, value: c}\n  - {key: a}\n",
        // Anchors, aliases and merge keys.
        "domain: d\nx_limit: &lim {unit: second, requests_per_unit: 3}\n",
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &lim {unit: second, requests_per_unit: 3}\n  - key: b\n    rate_limit: *lim\n",
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &lim {unit: second, requests_per_unit: 3}\n  - key: b\n    rate_limit:\n      <<: *lim\n      name: b\n",
        // Only the first document is read.
        "domain: d\n---\nnot: read\n",
    ] {
        if yaml.contains("x_limit") {
            // An unknown top-level key is refused, anchors or not.
            assert!(invalid(yaml).contains("unknown key 'x_limit'"));
            continue;
        }
        valid(yaml);
    }
}

#[test]
fn upstream_refuses_these_with_its_messages() {
    let cases: &[(&str, &str)] = &[
        ("", "c.yaml: config file cannot have empty domain"),
        (
            "# nothing but a comment\n",
            "c.yaml: config file cannot have empty domain",
        ),
        (
            "domain: \"\"\ndescriptors: []\n",
            "c.yaml: config file cannot have empty domain",
        ),
        (
            "descriptors:\n  - key: a\n",
            "c.yaml: config file cannot have empty domain",
        ),
        (
            "domain: d\ndescriptors:\n  - value: v\n",
            "c.yaml:3: descriptor has empty key",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: \"\"\n",
            "c.yaml:5: descriptor has empty key",
        ),
        (
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n  - key: key1\n    value: value1\n",
            "c.yaml:5: duplicate descriptor composite key 'test-domain.key1_value1'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: k\n      - key: k\n",
            "c.yaml:6: duplicate descriptor composite key 'd.a.k'",
        ),
        (
            "domain: d\ndescriptors:\n  - {key: a, value: b_c}\n  - {key: a_b, value: c}\n",
            "c.yaml:4: duplicate descriptor composite key 'd.a_b_c'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: foo, requests_per_unit: 1}\n",
            "c.yaml:3: invalid rate limit unit 'foo'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {requests_per_unit: 1}\n",
            "c.yaml:3: invalid rate limit unit ''",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: unknown, requests_per_unit: 1}\n",
            "c.yaml:3: invalid rate limit unit 'unknown'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: seconds, requests_per_unit: 1}\n",
            "c.yaml:3: invalid rate limit unit 'seconds'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n",
            "c.yaml:3: should not specify rate limit unit when unlimited",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: \"\"}]}\n",
            "c.yaml:3: should not have an empty replaces entry",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{}]}\n",
            "c.yaml:3: should not have an empty replaces entry",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {name: me, unit: second, requests_per_unit: 1, replaces: [{name: me}]}\n",
            "c.yaml:3: replaces should not contain name of same descriptor",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true\n",
            "c.yaml:3: share_threshold can only be used with wildcard values (containing '*'), but found key 'a_b'",
        ),
    ];
    for (yaml, message) in cases {
        assert_eq!(&invalid(yaml), message, "{yaml}");
    }
}

#[test]
fn parse_errors_name_the_key_and_the_line() {
    let starts: &[(&str, &str)] = &[
        (
            "domain: d\ndescriptors:\n  - key: a\n    ratelimit: {unit: second}\n",
            "c.yaml:4: config error, unknown key 'ratelimit'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requestsperunit: 5}\n",
            "c.yaml:4: config error, unknown key 'requestsperunit'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    0.25: x\n",
            "c.yaml:4: config error, key is not of type string: 0.25",
        ),
        (
            "domain: d\ndescriptors:\n  - a\n",
            "c.yaml:3: config error, yaml file contains list of type other than map: a",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [x]}\n",
            "c.yaml:4: config error, yaml file contains list of type other than map: x",
        ),
        (
            "domain: d\ndescriptors: [\n",
            "c.yaml:3: error loading config file: ",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
            "c.yaml:4: error loading config file: cannot unmarshal -1 into uint32",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n",
            "c.yaml:4: error loading config file: cannot unmarshal 4294967296 into uint32",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: lots}\n",
            "c.yaml:4: error loading config file: cannot unmarshal \"lots\" into uint32",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: maybe\n",
            "c.yaml:4: error loading config file: cannot read \"maybe\" as a boolean",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    key: b\n",
            "c.yaml:4: config error, key 'key' appears twice in the same map",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    metadata: {x: 1, x: 2}\n",
            "c.yaml:4: error loading config file: ",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    metadata: [1]\n",
            "c.yaml:4: error loading config file: `metadata` must be a map",
        ),
        ("- domain: d\n", "c.yaml:1: error loading config file: "),
        ("domain: [d]\n", "c.yaml:1: error loading config file: "),
    ];
    let wrong: Vec<String> = starts
        .iter()
        .map(|(yaml, start)| (yaml, start, invalid(yaml)))
        .filter(|(_, start, error)| !error.starts_with(*start))
        .map(|(yaml, start, error)| {
            format!("{yaml}\n{error}\nshould start with\n{start}\n")
        })
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn ignored_keys_are_warned_about() {
    let config = valid(
        "domain: d\ndescriptors:\n  - key: a\n    quota_mode: true\n    rate_limit: {unit: second, requests_per_unit: 1, shadow_mode: true}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 2000000}\n",
    );
    let warnings = config.warnings().join("\n");
    assert!(
        warnings.contains(
            "c.yaml:3: key 'shadow_mode' is not used in rate_limit: ignored"
        ),
        "{warnings}"
    );
    assert!(
        warnings.contains("quota_mode is not implemented"),
        "{warnings}"
    );
    assert!(warnings.contains("c.yaml:6: 'd.b': 2000000 per second is more than one request per microsecond: clamped"), "{warnings}");
}

#[test]
fn a_directory_is_every_file_but_dotfiles() {
    let dir = TempDir::new();
    dir.write("a.yaml", "domain: one\n");
    dir.write("sub/b.yml", "domain: two\n");
    dir.write("no-extension", "domain: three\n");
    dir.write(".swap.yaml", "not: a config\n");
    dir.write("..2026_01_01/c.yaml", "domain: ignored\n");
    let config = Config::load(dir.path()).expect("valid");
    let mut domains: Vec<_> = config.domains().collect();
    domains.sort_unstable();
    assert_eq!(domains, ["one", "three", "two"]);

    #[cfg(unix)]
    {
        // A ConfigMap: `config.yaml -> ..data/config.yaml`, `..data -> ..<ts>`.
        let map = TempDir::new();
        map.write("..2026_07_01/config.yaml", "domain: mapped\n");
        std::os::unix::fs::symlink("..2026_07_01", map.path().join("..data"))
            .expect("link");
        std::os::unix::fs::symlink(
            "..data/config.yaml",
            map.path().join("config.yaml"),
        )
        .expect("link");
        let config = Config::load(map.path()).expect("valid");
        assert_eq!(config.domains().collect::<Vec<_>>(), ["mapped"]);
    }

    dir.write("dup.yaml", "domain: one\n");
    let error = Config::load(dir.path()).unwrap_err();
    assert!(
        error
            .to_string()
            .ends_with("dup.yaml: duplicate domain 'one' in config file"),
        "{error}"
    );
    std::fs::remove_file(dir.path().join("dup.yaml")).expect("rm");
    std::fs::write(dir.path().join("latin1"), [b'd', 0xe9, b'\n'])
        .expect("write");
    let error = Config::load(dir.path()).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("latin1: error loading config file: not UTF-8"),
        "{error}"
    );
}

#[test]
fn check_config_exits_0_or_1_with_the_file_and_the_reason() {
    let binary = env!("CARGO_BIN_EXE_rate-tier-service");
    let dir = TempDir::new();
    let good = dir.write("good.yaml", "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}\n");
    let out = Command::new(binary)
        .arg("check-config")
        .arg(&good)
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("valid: 1 domain(s), 1 rule(s)"), "{stdout}");

    let bad = dir.write("bad.yaml", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight}\n");
    let out = Command::new(binary)
        .arg("check-config")
        .arg(&bad)
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim(),
        format!("{}:3: invalid rate limit unit 'fortnight'", bad.display())
    );

    let out = Command::new(binary)
        .arg("check-config")
        .arg(dir.path().join("missing"))
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));

    // A directory with no config file: the service would not start.
    let empty = TempDir::new();
    let out = Command::new(binary)
        .arg("check-config")
        .arg(empty.path())
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no config file found"), "{stderr}");

    let out = Command::new(binary).arg("--bogus").output().expect("runs");
    assert_eq!(out.status.code(), Some(2), "a usage error");
    let out = Command::new(binary)
        .args(["--config", "x", "--headers", "all"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));

    // The example config of the repository is valid.
    let example =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/ratelimit");
    let out = Command::new(binary)
        .arg("check-config")
        .arg(example)
        .output()
        .expect("runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn anchors_and_merge_keys_build_rules_and_keep_their_lines() {
    let config = valid(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &per_minute\n      unit: minute\n      requests_per_unit: 60\n  - key: b\n    rate_limit:\n      <<: *per_minute\n      requests_per_unit: 5\n  - key: c\n    rate_limit: *per_minute\n",
    );
    assert_eq!(config.rule_count(), 3);
    // An error inside a merged map names the line of its descriptor.
    let error = invalid(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &bad\n      unit: minutes\n      unlimited: true\n  - key: b\n    rate_limit:\n      <<: *bad\n      unlimited: false\n",
    );
    assert_eq!(error, "c.yaml:7: invalid rate limit unit 'minutes'");
    let error = invalid(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      <<: [1]\n",
    );
    assert!(
        error.starts_with("c.yaml:5: error loading config file: a merge key"),
        "{error}"
    );
}
