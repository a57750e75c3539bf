//! The key layout of shared stores: validated names, and the key of a
//! bucket.
//!
//! A bucket is one (limit, partition) pair: a tier and a user, an endpoint
//! limit and a user, a limit and an address. In a shared store (Redis) its
//! key is `trt:<limit>:<sha1_hex(partition)>` (`<limit>` a tier's name, or
//! `limit/<name>` for a limit of its own: see
//! [`LimitName`](crate::LimitName)), or with a [`KeySecret`]
//! `trt:<limit>:<hmac_sha1_hex(secret, partition)>`: the user id never
//! leaves the process in clear. Names are restricted to `[A-Za-z0-9_.-]`,
//! so the `:` that ends the name is unambiguous and two pairs can never
//! share a key.
//!
//! On a Redis Cluster the partition part is a hash tag,
//! `trt:<limit>:{<sha1_hex(partition)>}` ([`cluster_bucket_key`]): every
//! bucket of one user lives in one slot. See that function for why.

use std::fmt;

use hmac::{Hmac, Mac};
use sha1::{Digest, Sha1};

/// The longest tier name accepted, in bytes.
pub const MAX_TIER_NAME_LEN: usize = 64;

/// Why a tier name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidTierName {
    /// The name was empty.
    #[error("tier name is empty")]
    Empty,
    /// The name was longer than [`MAX_TIER_NAME_LEN`] bytes.
    #[error("tier name is longer than {MAX_TIER_NAME_LEN} bytes")]
    TooLong,
    /// The name held a character outside `[A-Za-z0-9_.-]`.
    #[error(
        "tier name {name:?} holds {found:?}; allowed: ASCII letters, digits, '_', '.', '-'"
    )]
    BadChar {
        /// The refused name.
        name: String,
        /// The first character not allowed.
        found: char,
    },
}

/// Checks that `name` can name a tier: 1 to 64 bytes of `[A-Za-z0-9_.-]`.
///
/// ```
/// use rate_tier_storage::key::{validate_tier_name, InvalidTierName};
/// assert!(validate_tier_name("free").is_ok());
/// assert!(validate_tier_name("pro-2026.v2").is_ok());
/// assert!(matches!(validate_tier_name("a:b"), Err(InvalidTierName::BadChar { found: ':', .. })));
/// assert!(matches!(validate_tier_name("{x}"), Err(InvalidTierName::BadChar { found: '{', .. })));
/// assert_eq!(validate_tier_name(""), Err(InvalidTierName::Empty));
/// ```
pub fn validate_tier_name(name: &str) -> Result<(), InvalidTierName> {
    if name.is_empty() {
        return Err(InvalidTierName::Empty);
    }
    if name.len() > MAX_TIER_NAME_LEN {
        return Err(InvalidTierName::TooLong);
    }
    match name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        Some(found) => Err(InvalidTierName::BadChar {
            name: name.to_owned(),
            found,
        }),
        None => Ok(()),
    }
}

/// A secret that turns the user part of shared keys into an HMAC-SHA1.
///
/// Plain SHA-1 of a low-entropy id (an IP address, an email) can be reversed
/// by trying values; an HMAC with a secret cannot, without the secret. Its
/// `Debug` output never shows the secret. An empty secret is refused: it
/// would look like protection and give none.
///
/// ```
/// use rate_tier_storage::key::{EmptySecret, KeySecret};
/// let secret = KeySecret::new(b"s3cret")?;
/// assert_eq!(format!("{secret:?}"), "KeySecret(..)");
/// assert_eq!(KeySecret::new("").unwrap_err(), EmptySecret);
/// # Ok::<(), EmptySecret>(())
/// ```
#[derive(Clone)]
pub struct KeySecret {
    // The keyed state after absorbing the secret: cloning it per key skips
    // re-hashing the secret.
    mac: Hmac<Sha1>,
}

/// A [`KeySecret`] must not be empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the key secret is empty: an HMAC with no secret protects nothing")]
pub struct EmptySecret;

impl KeySecret {
    /// A secret from any non-empty bytes (HMAC accepts every length).
    pub fn new(secret: impl AsRef<[u8]>) -> Result<Self, EmptySecret> {
        let secret = secret.as_ref();
        if secret.is_empty() {
            return Err(EmptySecret);
        }
        // new_from_slice only fails for MACs with a fixed key size; HMAC has none.
        let mac = match <Hmac<Sha1> as Mac>::new_from_slice(secret) {
            Ok(mac) => mac,
            Err(_) => unreachable!("HMAC takes keys of any length"),
        };
        Ok(KeySecret { mac })
    }
}

/// How a shared store lays out its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyLayout {
    /// One Redis: [`bucket_key`].
    Single,
    /// A Redis Cluster: [`cluster_bucket_key`], the partition as hash tag.
    Cluster,
}

/// The key of the bucket (`limit`, `partition`) in a store laid out as
/// `layout`.
///
/// ```
/// use rate_tier_storage::key::{KeyLayout, shared_key};
/// assert_eq!(
///     shared_key(KeyLayout::Cluster, "free", "key_ana", None),
///     "trt:free:{33d2315cbeb866b8b237240a98d605f2e6e41b8a}"
/// );
/// ```
pub fn shared_key(
    layout: KeyLayout,
    limit: &str,
    partition: &str,
    secret: Option<&KeySecret>,
) -> String {
    let hash = user_hash_hex(partition, secret);
    let mut key = String::with_capacity(limit.len().saturating_add(48));
    key.push_str("trt:");
    key.push_str(limit);
    match layout {
        KeyLayout::Single => {
            key.push(':');
            key.push_str(&hash);
        }
        KeyLayout::Cluster => {
            key.push_str(":{");
            key.push_str(&hash);
            key.push('}');
        }
    }
    key
}

impl fmt::Debug for KeySecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeySecret(..)")
    }
}

/// The shared-store key of the bucket of `user` in `tier`.
///
/// ```
/// use rate_tier_storage::key::{bucket_key, KeySecret};
/// // The 0.3 example's key: printf key_ana | sha1sum
/// assert_eq!(
///     bucket_key("free", "key_ana", None),
///     "trt:free:33d2315cbeb866b8b237240a98d605f2e6e41b8a"
/// );
/// let with_secret = bucket_key("free", "key_ana", Some(&KeySecret::new(b"k").unwrap()));
/// assert!(with_secret.starts_with("trt:free:"));
/// assert_ne!(with_secret, bucket_key("free", "key_ana", None));
/// ```
pub fn bucket_key(
    tier: &str,
    user: &str,
    secret: Option<&KeySecret>,
) -> String {
    shared_key(KeyLayout::Single, tier, user, secret)
}

/// The key of the bucket of `user` in `tier` on a Redis Cluster:
/// `trt:<tier>:{<sha1_hex(user)>}`, or `trt:<tier>:{<hmac_sha1_hex(secret,
/// user)>}` with a secret. The same as [`bucket_key`] with the user part
/// between braces.
///
/// # Why the braces
///
/// Redis Cluster puts each key in one of 16384 slots, `CRC16(key) mod
/// 16384`, and each slot on one node. When a key holds a `{...}` with
/// something between the braces (a *hash tag*), only that part is hashed.
/// A script (`EVAL`/`EVALSHA`) may only touch keys of one slot: Redis
/// refuses the others with `CROSSSLOT`. Checking several quotas of one user
/// all-or-nothing (a tier-wide quota and a per-endpoint one, each its own
/// bucket key) in one atomic script therefore needs every bucket of that
/// user in the same slot. The tag is the user's hash, not the tier: all the
/// tiers and endpoints of one user share a slot, while different users
/// still spread over all slots, and so over all nodes (a tag on the tier
/// would put every user of a tier on one node).
///
/// The single-node format, [`bucket_key`], stays as it was (the keys shown
/// in the 0.3 example): the two formats are different keys, so a store on a
/// single Redis and one on a cluster never mix. The tier cannot hold `{`
/// or `}` ([`validate_tier_name`]), so the first `{` of the key is always
/// the one that opens the user's hash, and that hash (40 hex digits) is
/// never empty.
///
/// ```
/// use rate_tier_storage::key::{bucket_key, cluster_bucket_key, KeySecret};
/// // printf key_ana | sha1sum
/// assert_eq!(
///     bucket_key("free", "key_ana", None),
///     "trt:free:33d2315cbeb866b8b237240a98d605f2e6e41b8a"
/// );
/// assert_eq!(
///     cluster_bucket_key("free", "key_ana", None),
///     "trt:free:{33d2315cbeb866b8b237240a98d605f2e6e41b8a}"
/// );
///
/// // What Redis Cluster hashes: the part between the first `{` and the next `}`.
/// fn hash_tag(key: &str) -> &str {
///     let open = key.find('{').unwrap();
///     let close = open + 1 + key[open + 1..].find('}').unwrap();
///     &key[open + 1..close]
/// }
/// // Two tiers of one user: one slot. Two users: (most likely) two slots.
/// let free = cluster_bucket_key("free", "key_ana", None);
/// let pro = cluster_bucket_key("pro", "key_ana", None);
/// assert_eq!(hash_tag(&free), hash_tag(&pro));
/// assert_ne!(hash_tag(&free), hash_tag(&cluster_bucket_key("free", "key_bea", None)));
///
/// // With a secret, the tag is the HMAC, as in `bucket_key`.
/// let secret = KeySecret::new(b"k").unwrap();
/// assert_eq!(
///     cluster_bucket_key("free", "key_ana", Some(&secret)),
///     bucket_key("free", "key_ana", Some(&secret)).replacen("trt:free:", "trt:free:{", 1) + "}"
/// );
/// ```
pub fn cluster_bucket_key(
    tier: &str,
    user: &str,
    secret: Option<&KeySecret>,
) -> String {
    shared_key(KeyLayout::Cluster, tier, user, secret)
}

/// The Redis Cluster slot of every bucket of `partition`: the CRC16
/// (XMODEM) of its hash tag, modulo 16384, as Redis computes it.
///
/// ```
/// use rate_tier_storage::key::cluster_slot;
/// // redis-cli CLUSTER KEYSLOT "trt:free:{33d2315cbeb866b8b237240a98d605f2e6e41b8a}"
/// assert_eq!(cluster_slot("key_ana", None), cluster_slot("key_ana", None));
/// assert!(cluster_slot("key_ana", None) < 16384);
/// ```
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub fn cluster_slot(partition: &str, secret: Option<&KeySecret>) -> u16 {
    let tag = user_hash_hex(partition, secret);
    crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % 16_384
}

/// The Redis Cluster slot of a key: the CRC16 of its hash tag (the part
/// between the first `{` and the next `}`, when not empty), or of the whole
/// key, modulo 16 384.
///
/// ```
/// use rate_tier_storage::key::{cluster_slot, slot_of_key};
/// let key = "trt:free:{33d2315cbeb866b8b237240a98d605f2e6e41b8a}";
/// assert_eq!(slot_of_key(key), cluster_slot("key_ana", None));
/// assert_eq!(slot_of_key("a{}b"), slot_of_key("a{}b"));
/// ```
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub fn slot_of_key(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tag = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tag.unwrap_or(bytes)) % 16_384
}

/// The limit's name in a bucket's key (`trt:<limit>:...`), for reports.
#[cfg(feature = "redis")]
pub(crate) fn limit_of_key(key: &str) -> &str {
    key.split(':').nth(1).unwrap_or_default()
}

/// `sha1_hex(user)`, or `hmac_sha1_hex(secret, user)` with a secret.
fn user_hash_hex(user: &str, secret: Option<&KeySecret>) -> String {
    let digest: [u8; 20] = match secret {
        Some(secret) => {
            let mut mac = secret.mac.clone();
            mac.update(user.as_bytes());
            mac.finalize().into_bytes().into()
        }
        None => Sha1::digest(user.as_bytes()).into(),
    };
    hex::encode(digest)
}
