//! A request's fingerprint: what tells a key reused with another request
//! (422) from a duplicate (the stored answer).

use sha2::{Digest, Sha256};

use super::Fingerprint;

impl Fingerprint {
    /// The fingerprint of a request with `body`: none, its SHA-256 byte for
    /// byte, or the SHA-256 of its canonical JSON (byte for byte where it
    /// has none).
    pub(crate) fn of(self, body: &[u8]) -> Option<[u8; 32]> {
        match self {
            Fingerprint::None => None,
            Fingerprint::Body => Some(Sha256::digest(body).into()),
            Fingerprint::Json => Some(match canonical_json(body) {
                Some(canonical) => Sha256::digest(&canonical).into(),
                None => Sha256::digest(body).into(),
            }),
        }
    }
}

/// `body`'s JSON with members sorted by name and no whitespace; `None`
/// when it is not JSON, names a member twice in one object (which member a
/// handler reads is not ours to guess), or has an integral number past 64
/// bits (serde_json reads an integer that large as an `f64`, where two ids
/// become one; a `u128` handler tells them apart): such a body is
/// fingerprinted byte for byte. One pass over the body.
fn canonical_json(body: &[u8]) -> Option<Vec<u8>> {
    use serde::de::{Deserialize, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};

    enum Canon {
        Scalar(String),
        Array(Vec<Canon>),
        Object(Vec<(String, Canon)>),
    }

    impl<'de> Deserialize<'de> for Canon {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Canon;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("JSON")
                }
                fn visit_unit<E>(self) -> Result<Canon, E> {
                    Ok(Canon::Scalar("null".to_owned()))
                }
                fn visit_bool<E>(self, v: bool) -> Result<Canon, E> {
                    Ok(Canon::Scalar(v.to_string()))
                }
                fn visit_i64<E>(self, v: i64) -> Result<Canon, E> {
                    Ok(Canon::Scalar(v.to_string()))
                }
                fn visit_u64<E>(self, v: u64) -> Result<Canon, E> {
                    Ok(Canon::Scalar(v.to_string()))
                }
                fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Canon, E> {
                    // Perhaps an integer too large for 64 bits, rounded.
                    if v.fract() == 0.0 && !(i64::MIN as f64..u64::MAX as f64).contains(&v) {
                        return Err(E::custom("an integer past 64 bits"));
                    }
                    Ok(Canon::Scalar(serde_json::Value::from(v).to_string()))
                }
                fn visit_str<E>(self, v: &str) -> Result<Canon, E> {
                    Ok(Canon::Scalar(serde_json::Value::from(v).to_string()))
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Canon, A::Error> {
                    let mut items = Vec::new();
                    while let Some(item) = seq.next_element()? {
                        items.push(item);
                    }
                    Ok(Canon::Array(items))
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Canon, A::Error> {
                    let mut members: Vec<(String, Canon)> = Vec::new();
                    while let Some(member) = map.next_entry()? {
                        members.push(member);
                    }
                    members.sort_by(|a, b| a.0.cmp(&b.0));
                    if members.windows(2).any(|w| w[0].0 == w[1].0) {
                        return Err(A::Error::custom("a member named twice"));
                    }
                    Ok(Canon::Object(members))
                }
            }
            d.deserialize_any(V)
        }
    }

    fn write(v: &Canon, out: &mut Vec<u8>) {
        match v {
            Canon::Scalar(s) => out.extend_from_slice(s.as_bytes()),
            Canon::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write(item, out);
                }
                out.push(b']');
            }
            Canon::Object(members) => {
                out.push(b'{');
                for (i, (name, value)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(
                        serde_json::Value::from(name.as_str())
                            .to_string()
                            .as_bytes(),
                    );
                    out.push(b':');
                    write(value, out);
                }
                out.push(b'}');
            }
        }
    }
    let value: Canon = serde_json::from_slice(body).ok()?;
    let mut out = Vec::with_capacity(body.len());
    write(&value, &mut out);
    Some(out)
}
