//! A string map of an object's metadata (labels, annotations) decoded with only the keys its reader
//! keeps: the other values are skipped as `serde`'s `IgnoredAny`, no string made of them nor of their
//! keys. Decoding watch events is most of what a watching runner does, and the maps are the largest part
//! of a managed job's metadata (the runner's own records), so both the monitor's read types
//! (`crate::monitor::slim`) and the submit path's names view ([`super::whole_nodes::HoldMeta`]) decode
//! them through this one type.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// Which keys of a string map are kept.
pub trait Keys {
    /// Whether the value under `key` is decoded and kept.
    fn keep(key: &str) -> bool;
}

/// A string map of which only the keys `K` keeps are decoded. `null` or missing: `None`.
pub struct Kept<K> {
    map: Option<BTreeMap<String, String>>,
    keys: PhantomData<K>,
}

impl<K> Kept<K> {
    /// The kept entries, as `ObjectMeta` holds a map (`None` where the object had none).
    pub fn into_map(self) -> Option<BTreeMap<String, String>> {
        self.map
    }
}

impl<K> Default for Kept<K> {
    fn default() -> Self {
        Self {
            map: None,
            keys: PhantomData,
        }
    }
}

impl<'de, K: Keys> Deserialize<'de> for Kept<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct MapVisitor<K>(PhantomData<K>);

        impl<'de, K: Keys> Visitor<'de> for MapVisitor<K> {
            type Value = Option<BTreeMap<String, String>>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of strings or null")
            }

            fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }

            fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }

            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_map(self)
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut kept = BTreeMap::new();
                while let Some(key) = map.next_key::<KeyIf<K>>()? {
                    match key.0 {
                        Some(key) => {
                            kept.insert(key, map.next_value::<String>()?);
                        }
                        None => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(Some(kept))
            }
        }

        let map = d.deserialize_option(MapVisitor::<K>(PhantomData))?;
        Ok(Self {
            map,
            keys: PhantomData,
        })
    }
}

/// A map key, made a string only when `K` keeps it.
struct KeyIf<K>(Option<String>, PhantomData<K>);

impl<'de, K: Keys> Deserialize<'de> for KeyIf<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor<K>(PhantomData<K>);

        impl<K: Keys> Visitor<'_> for KeyVisitor<K> {
            type Value = KeyIf<K>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string key")
            }

            fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Self::Value, E> {
                Ok(KeyIf(K::keep(key).then(|| key.to_owned()), PhantomData))
            }
        }

        d.deserialize_str(KeyVisitor::<K>(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Short;
    impl Keys for Short {
        fn keep(key: &str) -> bool {
            key.len() <= 2
        }
    }

    /// Only the kept keys come back; the others' values may be anything JSON holds (they are skipped
    /// unread); `null` and a missing map are `None`, an empty one is an empty map.
    #[test]
    fn only_the_kept_keys_are_decoded() {
        #[derive(Deserialize)]
        struct M {
            #[serde(default)]
            a: Kept<Short>,
        }
        let m: M = serde_json::from_str(r#"{"a":{"ab":"1","long":{"x":[1,2]},"c":"2"}}"#).unwrap();
        let map = m.a.into_map().unwrap();
        assert_eq!(
            map.into_iter().collect::<Vec<_>>(),
            [("ab".into(), "1".into()), ("c".into(), "2".into())]
        );
        let null: M = serde_json::from_str(r#"{"a":null}"#).unwrap();
        assert!(null.a.into_map().is_none());
        let missing: M = serde_json::from_str("{}").unwrap();
        assert!(missing.a.into_map().is_none());
        let empty: M = serde_json::from_str(r#"{"a":{}}"#).unwrap();
        assert_eq!(empty.a.into_map(), Some(BTreeMap::new()));
        // A kept key whose value is not a string is an error, as in ObjectMeta.
        assert!(serde_json::from_str::<M>(r#"{"a":{"ab":1}}"#).is_err());
    }
}
