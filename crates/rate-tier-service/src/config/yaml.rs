//! One file of envoyproxy/ratelimit's YAML format, decoded as that service
//! decodes it (go-yaml v2, YAML 1.1), into a raw tree: no semantic checks
//! yet (those are in [`super::build`]), but every key checked as it is read.
//!
//! Upstream reads a file twice: once into a generic map whose keys must all
//! belong to one global set (`config error, unknown key 'x'`), then into
//! typed structs that silently drop a known key in the wrong place (a
//! `shadow_mode` inside `rate_limit`). Here one pass does both: each level
//! takes its own keys, refuses a key outside the global set with upstream's
//! message, and keeps a known key of another level as a warning (accepted,
//! as upstream accepts it, but said). A key given twice in one map is an
//! error (go-yaml v2 keeps the last one silently).
//!
//! Scalars follow go-yaml v2 where it matters: a number or a boolean read
//! into a string keeps its text (`value: 200` is `"200"`); `~`, `null` and
//! an empty value are "absent"; booleans accept YAML 1.1's `yes`/`no`/
//! `on`/`off`/`y`/`n`; integers accept `0x`, `0b`, `0o`, a leading-zero
//! octal (`010` is 8) and underscores.

use std::fmt;

use serde::de::{
    self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess,
    Visitor,
};

/// Every key upstream knows, at any level (`validKeys` in its
/// `config_impl.go`).
pub(crate) const VALID_KEYS: [&str; 16] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// The marker of the error raised on a merge key (`<<`), so that the file
/// is decoded again through `yaml_serde::Value::apply_merge`.
pub(crate) const MERGE_KEY_MARKER: &str = "\u{0}merge key\u{0}";

/// The top of a file.
#[derive(Debug, Default)]
pub(crate) struct RawRoot {
    pub(crate) domain: Option<String>,
    pub(crate) descriptors: Vec<RawDescriptor>,
    /// Known keys found at a level that does not use them (ignored).
    pub(crate) misplaced: Vec<String>,
}

/// One `descriptors` entry, at any depth.
#[derive(Debug, Default)]
pub(crate) struct RawDescriptor {
    pub(crate) key: Option<String>,
    pub(crate) value: Option<String>,
    pub(crate) rate_limit: Option<RawRateLimit>,
    pub(crate) descriptors: Vec<RawDescriptor>,
    pub(crate) shadow_mode: bool,
    pub(crate) quota_mode: bool,
    pub(crate) detailed_metric: bool,
    pub(crate) value_to_metric: bool,
    pub(crate) share_threshold: bool,
    pub(crate) has_metadata: bool,
    pub(crate) misplaced: Vec<String>,
}

/// A `rate_limit` map.
#[derive(Debug, Default)]
pub(crate) struct RawRateLimit {
    pub(crate) unit: Option<String>,
    pub(crate) requests_per_unit: u32,
    pub(crate) unlimited: bool,
    pub(crate) name: Option<String>,
    /// The `name` of each `replaces` entry (`None` when missing or empty).
    pub(crate) replaces: Vec<Option<String>>,
    pub(crate) misplaced: Vec<String>,
}

/// Reads a map key: a string, or upstream's error for any other scalar.
struct KeyName;

impl<'de> DeserializeSeed<'de> for KeyName {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(
        self,
        d: D,
    ) -> Result<String, D::Error> {
        d.deserialize_any(self)
    }
}

fn not_a_string<E: de::Error>(key: impl fmt::Display) -> E {
    E::custom(format_args!(
        "config error, key is not of type string: {key}"
    ))
}

impl<'de> Visitor<'de> for KeyName {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
        Err(not_a_string(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        Err(not_a_string(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        Err(not_a_string(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
        Err(not_a_string(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<String, E> {
        Err(not_a_string("<nil>"))
    }
}

/// What a map visitor does with a key that is not its own.
fn foreign_key<'de, A: MapAccess<'de>>(
    map: &mut A,
    key: &str,
    misplaced: &mut Vec<String>,
) -> Result<(), A::Error> {
    if key == "<<" {
        return Err(de::Error::custom(MERGE_KEY_MARKER));
    }
    if !VALID_KEYS.contains(&key) {
        return Err(de::Error::custom(format_args!(
            "config error, unknown key '{key}'"
        )));
    }
    misplaced.push(key.to_owned());
    if key == "metadata" {
        map.next_value::<IgnoredAny>()?;
    } else {
        // Upstream still checks the keys below a misplaced one.
        map.next_value::<Generic>()?;
    }
    Ok(())
}

/// Refuses a key given twice in one map.
fn first_time<E: de::Error>(
    seen: &mut Vec<String>,
    key: &str,
) -> Result<(), E> {
    if seen.iter().any(|k| k == key) {
        return Err(E::custom(format_args!(
            "config error, key '{key}' appears twice in the same map"
        )));
    }
    seen.push(key.to_owned());
    Ok(())
}

/// A value below a misplaced key: upstream's generic key check only.
struct Generic;

impl<'de> de::Deserialize<'de> for Generic {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(GenericVisitor)
    }
}

struct GenericVisitor;

impl<'de> Visitor<'de> for GenericVisitor {
    type Value = Generic;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Generic, E> {
        Ok(Generic)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Generic, E> {
        Ok(Generic)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Generic, E> {
        Ok(Generic)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Generic, E> {
        Ok(Generic)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Generic, E> {
        Ok(Generic)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Generic, E> {
        Ok(Generic)
    }
    fn visit_none<E: de::Error>(self) -> Result<Generic, E> {
        Ok(Generic)
    }

    fn visit_seq<A: SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> Result<Generic, A::Error> {
        while seq.next_element_seed(MapOnly(GenericMap))?.is_some() {}
        Ok(Generic)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Generic, A::Error> {
        GenericMap.visit_map(map)
    }
}

struct GenericMap;

impl<'de> Visitor<'de> for GenericMap {
    type Value = Generic;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map")
    }

    fn visit_map<A: MapAccess<'de>>(
        self,
        mut map: A,
    ) -> Result<Generic, A::Error> {
        let mut seen = Vec::new();
        while let Some(key) = map.next_key_seed(KeyName)? {
            first_time(&mut seen, &key)?;
            if key == "<<" {
                return Err(de::Error::custom(MERGE_KEY_MARKER));
            }
            if !VALID_KEYS.contains(&key.as_str()) {
                return Err(de::Error::custom(format_args!(
                    "config error, unknown key '{key}'"
                )));
            }
            if key == "metadata" {
                map.next_value::<IgnoredAny>()?;
            } else {
                map.next_value::<Generic>()?;
            }
        }
        Ok(Generic)
    }
}

/// The elements of a list, which upstream requires to be maps: anything
/// else is `config error, yaml file contains list of type other than map`.
struct MapOnly<V>(V);

fn not_a_map<E: de::Error>(element: impl fmt::Display) -> E {
    E::custom(format_args!(
        "config error, yaml file contains list of type other than map: {element}"
    ))
}

impl<'de, V: Visitor<'de>> DeserializeSeed<'de> for MapOnly<V> {
    type Value = V::Value;

    fn deserialize<D: Deserializer<'de>>(
        self,
        d: D,
    ) -> Result<V::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, V: Visitor<'de>> Visitor<'de> for MapOnly<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map")
    }

    fn visit_map<A: MapAccess<'de>>(
        self,
        map: A,
    ) -> Result<V::Value, A::Error> {
        self.0.visit_map(map)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<V::Value, E> {
        Err(not_a_map(v))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<V::Value, E> {
        Err(not_a_map(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<V::Value, E> {
        Err(not_a_map(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<V::Value, E> {
        Err(not_a_map(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<V::Value, E> {
        Err(not_a_map(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        Err(not_a_map("<nil>"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<V::Value, A::Error> {
        Err(not_a_map("[...]"))
    }
}

/// A list of maps, or null (no entries).
struct ListOf<V>(V);

impl<'de, V: Visitor<'de> + Clone> DeserializeSeed<'de> for ListOf<V> {
    type Value = Vec<V::Value>;

    fn deserialize<D: Deserializer<'de>>(
        self,
        d: D,
    ) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, V: Visitor<'de> + Clone> Visitor<'de> for ListOf<V> {
    type Value = Vec<V::Value>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of maps")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }

    fn visit_seq<A: SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(MapOnly(self.0.clone()))? {
            items.push(item);
        }
        Ok(items)
    }
}

/// A string field: the scalar's text whatever its type; `None` when null.
struct Text;

impl<'de> DeserializeSeed<'de> for Text {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(
        self,
        d: D,
    ) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for Text {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(
        self,
        d: D,
    ) -> Result<Self::Value, D::Error> {
        d.deserialize_str(TextInner).map(Some)
    }
}

struct TextInner;

impl<'de> Visitor<'de> for TextInner {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }
    // From a `yaml_serde::Value` (the merge-key path), scalars come typed.
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
        Ok(v.to_string())
    }
}

/// A boolean, YAML 1.1 style (`yes`, `on`, `y`...); null is false.
struct Flag(&'static str);

impl<'de> DeserializeSeed<'de> for Flag {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Flag {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a boolean for `{}`", self.0)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
        Ok(v)
    }

    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_none<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
        match v {
            "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "true"
            | "True" | "TRUE" => Ok(true),
            "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF"
            | "false" | "False" | "FALSE" => Ok(false),
            _ => Err(E::custom(format_args!(
                "error loading config file: cannot read {v:?} as a boolean for `{}`",
                self.0
            ))),
        }
    }
}

/// `requests_per_unit`: an unsigned 32-bit integer (null is 0).
struct Count;

impl<'de> DeserializeSeed<'de> for Count {
    type Value = u32;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u32, D::Error> {
        d.deserialize_any(self)
    }
}

fn out_of_range<E: de::Error>(v: impl fmt::Display) -> E {
    E::custom(format_args!(
        "error loading config file: cannot unmarshal {v} into uint32 (requests_per_unit)"
    ))
}

/// An integer in YAML 1.1's syntax: sign, `0x`, `0b`, `0o` or a leading
/// `0` (octal), `_` separators.
fn yaml11_int(text: &str) -> Option<i128> {
    let (negative, digits) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let digits: String = digits.chars().filter(|c| *c != '_').collect();
    let (radix, body) = if let Some(hex) = digits.strip_prefix("0x") {
        (16, hex)
    } else if let Some(bin) = digits.strip_prefix("0b") {
        (2, bin)
    } else if let Some(oct) = digits.strip_prefix("0o") {
        (8, oct)
    } else if digits.len() > 1 && digits.starts_with('0') {
        (8, &digits[1..])
    } else {
        (10, digits.as_str())
    };
    if body.is_empty() {
        return None;
    }
    let magnitude = i128::from_str_radix(body, radix).ok()?;
    Some(if negative { -magnitude } else { magnitude })
}

impl<'de> Visitor<'de> for Count {
    type Value = u32;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an integer from 0 to 4294967295")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u32, E> {
        u32::try_from(v).map_err(|_| out_of_range(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u32, E> {
        u32::try_from(v).map_err(|_| out_of_range(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<u32, E> {
        Err(out_of_range(v))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<u32, E> {
        Err(out_of_range(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<u32, E> {
        Ok(0)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<u32, E> {
        match yaml11_int(v) {
            Some(n) => u32::try_from(n).map_err(|_| out_of_range(v)),
            None => Err(out_of_range(format_args!("{v:?}"))),
        }
    }
}

/// `metadata`: any map (checked for duplicate keys by `yaml_serde`), or
/// null. It is accepted and not used (see the crate docs).
fn read_metadata<'de, A: MapAccess<'de>>(
    map: &mut A,
) -> Result<bool, A::Error> {
    let value: yaml_serde::Value = map.next_value()?;
    match value {
        yaml_serde::Value::Null => Ok(false),
        yaml_serde::Value::Mapping(_) => Ok(true),
        _ => Err(de::Error::custom(
            "error loading config file: `metadata` must be a map",
        )),
    }
}

/// The top-level map of a file (or an empty document).
pub(crate) struct RootVisitor;

impl<'de> de::Deserialize<'de> for RawRoot {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RootVisitor)
    }
}

impl<'de> Visitor<'de> for RootVisitor {
    type Value = RawRoot;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map with `domain` and `descriptors`")
    }

    fn visit_unit<E: de::Error>(self) -> Result<RawRoot, E> {
        Ok(RawRoot::default())
    }

    fn visit_none<E: de::Error>(self) -> Result<RawRoot, E> {
        Ok(RawRoot::default())
    }

    fn visit_map<A: MapAccess<'de>>(
        self,
        mut map: A,
    ) -> Result<RawRoot, A::Error> {
        let mut root = RawRoot::default();
        let mut seen = Vec::new();
        while let Some(key) = map.next_key_seed(KeyName)? {
            first_time(&mut seen, &key)?;
            match key.as_str() {
                "domain" => root.domain = map.next_value_seed(Text)?,
                "descriptors" => {
                    root.descriptors =
                        map.next_value_seed(ListOf(DescriptorVisitor))?
                }
                other => foreign_key(&mut map, other, &mut root.misplaced)?,
            }
        }
        Ok(root)
    }
}

#[derive(Clone)]
struct DescriptorVisitor;

impl<'de> Visitor<'de> for DescriptorVisitor {
    type Value = RawDescriptor;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a descriptor map")
    }

    fn visit_map<A: MapAccess<'de>>(
        self,
        mut map: A,
    ) -> Result<RawDescriptor, A::Error> {
        let mut d = RawDescriptor::default();
        let mut seen = Vec::new();
        while let Some(key) = map.next_key_seed(KeyName)? {
            first_time(&mut seen, &key)?;
            match key.as_str() {
                "key" => d.key = map.next_value_seed(Text)?,
                "value" => d.value = map.next_value_seed(Text)?,
                "rate_limit" => {
                    d.rate_limit = map.next_value_seed(RateLimitSeed)?
                }
                "descriptors" => {
                    d.descriptors =
                        map.next_value_seed(ListOf(DescriptorVisitor))?
                }
                "shadow_mode" => {
                    d.shadow_mode = map.next_value_seed(Flag("shadow_mode"))?
                }
                "quota_mode" => {
                    d.quota_mode = map.next_value_seed(Flag("quota_mode"))?
                }
                "detailed_metric" => {
                    d.detailed_metric =
                        map.next_value_seed(Flag("detailed_metric"))?
                }
                "value_to_metric" => {
                    d.value_to_metric =
                        map.next_value_seed(Flag("value_to_metric"))?
                }
                "share_threshold" => {
                    d.share_threshold =
                        map.next_value_seed(Flag("share_threshold"))?
                }
                "metadata" => d.has_metadata = read_metadata(&mut map)?,
                other => foreign_key(&mut map, other, &mut d.misplaced)?,
            }
        }
        Ok(d)
    }
}

/// `rate_limit`: a map, or null (the same as absent).
struct RateLimitSeed;

impl<'de> DeserializeSeed<'de> for RateLimitSeed {
    type Value = Option<RawRateLimit>;

    fn deserialize<D: Deserializer<'de>>(
        self,
        d: D,
    ) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for RateLimitSeed {
    type Value = Option<RawRateLimit>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a `rate_limit` map")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_map<A: MapAccess<'de>>(
        self,
        mut map: A,
    ) -> Result<Self::Value, A::Error> {
        let mut r = RawRateLimit::default();
        let mut seen = Vec::new();
        while let Some(key) = map.next_key_seed(KeyName)? {
            first_time(&mut seen, &key)?;
            match key.as_str() {
                "unit" => r.unit = map.next_value_seed(Text)?,
                "requests_per_unit" => {
                    r.requests_per_unit = map.next_value_seed(Count)?
                }
                "unlimited" => {
                    r.unlimited = map.next_value_seed(Flag("unlimited"))?
                }
                "name" => r.name = map.next_value_seed(Text)?,
                "replaces" => {
                    r.replaces = map.next_value_seed(ListOf(ReplacesVisitor))?
                }
                other => foreign_key(&mut map, other, &mut r.misplaced)?,
            }
        }
        Ok(Some(r))
    }
}

#[derive(Clone)]
struct ReplacesVisitor;

impl<'de> Visitor<'de> for ReplacesVisitor {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a `replaces` entry: {name: ...}")
    }

    fn visit_map<A: MapAccess<'de>>(
        self,
        mut map: A,
    ) -> Result<Option<String>, A::Error> {
        let mut name = None;
        let mut seen = Vec::new();
        let mut ignored = Vec::new();
        while let Some(key) = map.next_key_seed(KeyName)? {
            first_time(&mut seen, &key)?;
            match key.as_str() {
                "name" => name = map.next_value_seed(Text)?,
                other => foreign_key(&mut map, other, &mut ignored)?,
            }
        }
        Ok(name.filter(|n| !n.is_empty()))
    }
}

/// Finds where the descriptor at `path` (indexes into the nested
/// `descriptors` lists) starts, for the line of an error found after
/// decoding: the file is decoded again, and decoding fails on purpose at
/// that descriptor, where `yaml_serde` knows the position.
pub(crate) fn locate(text: &str, path: &[usize]) -> Option<usize> {
    let document = yaml_serde::Deserializer::from_str(text).next()?;
    let error = match document.deserialize_any(Locate { path }) {
        Ok(()) => return None,
        Err(error) => error,
    };
    if !error.to_string().contains(LOCATE_MARKER) {
        return None;
    }
    error.location().map(|l| l.line())
}

const LOCATE_MARKER: &str = "\u{0}found\u{0}";

struct Locate<'p> {
    path: &'p [usize],
}

impl<'de> DeserializeSeed<'de> for Locate<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Locate<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some((first, rest)) = self.path.split_first() else {
            return Err(de::Error::custom(LOCATE_MARKER));
        };
        while let Some(key) = map.next_key::<IgnoredKey>()? {
            if key.0.as_deref() == Some("descriptors") {
                map.next_value_seed(LocateIn {
                    index: *first,
                    rest,
                })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

struct IgnoredKey(Option<String>);

impl<'de> de::Deserialize<'de> for IgnoredKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(IgnoredKey(d.deserialize_any(KeyName).ok()))
    }
}

struct LocateIn<'p> {
    index: usize,
    rest: &'p [usize],
}

impl<'de> DeserializeSeed<'de> for LocateIn<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for LocateIn<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list")
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        loop {
            if i == self.index {
                seq.next_element_seed(Locate { path: self.rest })?;
                return Ok(());
            }
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml11_integers() {
        assert_eq!(yaml11_int("010"), Some(8));
        assert_eq!(yaml11_int("0x10"), Some(16));
        assert_eq!(yaml11_int("1_000"), Some(1000));
        assert_eq!(yaml11_int("-3"), Some(-3));
        assert_eq!(yaml11_int("abc"), None);
        assert_eq!(yaml11_int("0"), Some(0));
    }
}
