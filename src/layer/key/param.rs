//! A path parameter read as axum's `Path` reads it.
//!
//! axum hands each parameter of the matched route, percent-decoded, to a
//! deserializer of one value (`ValueDeserializer` in axum's
//! `extract/path/de.rs`, the one a field of `Path<Params>` or an element of
//! `Path<(A, B)>` is read with; for the types a single `Path<T>` reads, it
//! reads the same). This is that deserializer for the one parameter a key
//! names: primitives parsed with `FromStr`, strings as they are, `Option`
//! as `Some`, unit enum variants by name; what axum does not support is
//! refused with the status axum gives (500). `tests/keys/path_param.rs`
//! checks the two agree on generated parameters.

use std::any::type_name;
use std::fmt;

use http::StatusCode;
use serde::de::{self, DeserializeOwned, DeserializeSeed, Visitor};
use serde::forward_to_deserialize_any;

use super::Refused;

/// Parameter `name` with the (percent-decoded) `value`, as `T`.
pub(super) fn parse<T: DeserializeOwned>(name: &str, value: &str) -> Result<T, Refused> {
    T::deserialize(Param { name, value }).map_err(|e| Refused::Rejected {
        status: e.status,
        detail: match e.status {
            StatusCode::BAD_REQUEST => format!("Invalid URL: {}", e.detail),
            _ => e.detail,
        },
    })
}

/// Why a parameter is not a `T`, in axum's words and with its status.
#[derive(Debug)]
struct Error {
    status: StatusCode,
    detail: String,
    /// A visitor's own message (axum's `ErrorKind::Message`), which axum
    /// names the parameter and value in.
    message: bool,
}

impl Error {
    fn unsupported(name: &str) -> Self {
        Error {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            detail: format!("Unsupported type `{name}`"),
            message: false,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    fn custom<M: fmt::Display>(msg: M) -> Self {
        Error {
            status: StatusCode::BAD_REQUEST,
            detail: msg.to_string(),
            message: true,
        }
    }
}

/// One named parameter's value.
struct Param<'de> {
    name: &'de str,
    value: &'de str,
}

impl Param<'_> {
    fn parse<P: std::str::FromStr>(&self, ty: &str) -> Result<P, Error> {
        self.value.parse().map_err(|_| Error {
            status: StatusCode::BAD_REQUEST,
            detail: format!(
                "Cannot parse `{}` with value `{}` to a `{ty}`",
                self.name, self.value
            ),
            message: false,
        })
    }
}

macro_rules! parsed {
    ($($method:ident => $visit:ident, $ty:ty, $label:literal;)*) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
                visitor.$visit(self.parse::<$ty>($label)?)
            }
        )*
    };
}

macro_rules! unsupported {
    ($($method:ident($($arg:ty),*);)*) => {
        $(
            fn $method<V: Visitor<'de>>(self, $(_: $arg,)* _: V) -> Result<V::Value, Error> {
                Err(Error::unsupported(type_name::<V::Value>()))
            }
        )*
    };
}

impl<'de> de::Deserializer<'de> for Param<'de> {
    type Error = Error;

    parsed! {
        deserialize_bool => visit_bool, bool, "bool";
        deserialize_i8 => visit_i8, i8, "i8";
        deserialize_i16 => visit_i16, i16, "i16";
        deserialize_i32 => visit_i32, i32, "i32";
        deserialize_i64 => visit_i64, i64, "i64";
        deserialize_i128 => visit_i128, i128, "i128";
        deserialize_u8 => visit_u8, u8, "u8";
        deserialize_u16 => visit_u16, u16, "u16";
        deserialize_u32 => visit_u32, u32, "u32";
        deserialize_u64 => visit_u64, u64, "u64";
        deserialize_u128 => visit_u128, u128, "u128";
        deserialize_f32 => visit_f32, f32, "f32";
        deserialize_f64 => visit_f64, f64, "f64";
        deserialize_char => visit_char, char, "char";
        deserialize_string => visit_string, String, "String";
        deserialize_byte_buf => visit_string, String, "String";
    }

    unsupported! {
        deserialize_map();
        deserialize_identifier();
        deserialize_seq();
        deserialize_tuple_struct(&'static str, usize);
        deserialize_struct(&'static str, &'static [&'static str]);
    }

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_borrowed_str(self.value).map_err(|e| match e {
            Error { message: true, .. } => Error {
                detail: format!(
                    "Cannot parse `{}` with value `{}`: {}",
                    self.name, self.value, e.detail
                ),
                message: false,
                ..e
            },
            e => e,
        })
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_borrowed_bytes(self.value.as_bytes())
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_some(self)
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    /// axum reads a pair inside a struct field as (name, value) and then
    /// refuses it at the first element.
    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, Error> {
        if len == 2 {
            visitor.visit_seq(NoArrays)
        } else {
            Err(Error::unsupported(type_name::<V::Value>()))
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_enum(self)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }
}

/// A unit variant named by the value.
impl<'de> de::EnumAccess<'de> for Param<'de> {
    type Error = Error;
    type Variant = UnitOnly;

    fn variant_seed<S: DeserializeSeed<'de>>(self, seed: S) -> Result<(S::Value, UnitOnly), Error> {
        Ok((seed.deserialize(Name(self.value))?, UnitOnly))
    }
}

/// A variant's name: read as a string, and as nothing else.
struct Name<'de>(&'de str);

impl<'de> de::Deserializer<'de> for Name<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Error> {
        Err(de::Error::custom("Unexpected key type"))
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_str(self.0)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_str(self.0)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_str(self.0)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char bytes
        byte_buf option unit unit_struct seq tuple
        tuple_struct map newtype_struct struct enum ignored_any
    }
}

struct UnitOnly;

impl<'de> de::VariantAccess<'de> for UnitOnly {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        Ok(())
    }

    fn newtype_variant_seed<S: DeserializeSeed<'de>>(self, _: S) -> Result<S::Value, Error> {
        Err(Error::unsupported("newtype enum variant"))
    }

    fn tuple_variant<V: Visitor<'de>>(self, _: usize, _: V) -> Result<V::Value, Error> {
        Err(Error::unsupported("tuple enum variant"))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Error> {
        Err(Error::unsupported("struct enum variant"))
    }
}

/// The elements of a pair, which axum refuses.
struct NoArrays;

impl<'de> de::SeqAccess<'de> for NoArrays {
    type Error = Error;

    fn next_element_seed<S: DeserializeSeed<'de>>(
        &mut self,
        _: S,
    ) -> Result<Option<S::Value>, Error> {
        Err(de::Error::custom("array types are not supported"))
    }
}
