//! The member of a map that a key names, read once: the JSON pointer's
//! step into an object and the query's named parameter both read every
//! member, so that a repeated one is seen rather than silently replaced.

use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{IgnoredAny, MapAccess, Visitor};

/// What a map holds under the name.
pub(super) enum Found<V> {
    Absent,
    Once(V),
    /// Named twice (or more): which one a reader takes depends on the
    /// reader.
    Repeated,
}

/// Reads every member of a map; the value of the one named `.0` as a `V`.
pub(super) struct Named<'n, V>(pub(super) &'n str, pub(super) PhantomData<V>);

impl<'de, V: Deserialize<'de>> Visitor<'de> for Named<'_, V> {
    type Value = Found<V>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found<V>, A::Error> {
        let mut found = Found::Absent;
        while let Some(name) = map.next_key::<String>()? {
            if name != self.0 {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            found = match found {
                Found::Absent => Found::Once(map.next_value()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    Found::Repeated
                }
            };
        }
        Ok(found)
    }
}
