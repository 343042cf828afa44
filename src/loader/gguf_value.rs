//! GGUF metadata values: the value types by their ids, the values themselves, and the typed conversions
//! [`super::gguf::GgufFile::get`] reads them with.

/// A metadata value's type, by its GGUF id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    const ALL: [ValueType; 13] = [
        ValueType::U8,
        ValueType::I8,
        ValueType::U16,
        ValueType::I16,
        ValueType::U32,
        ValueType::I32,
        ValueType::F32,
        ValueType::Bool,
        ValueType::String,
        ValueType::Array,
        ValueType::U64,
        ValueType::I64,
        ValueType::F64,
    ];

    pub fn from_id(id: u32) -> Option<ValueType> {
        Self::ALL.get(id as usize).copied()
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    /// The fewest bytes one value of this type takes in a file (a string's or array's length field alone).
    pub fn min_bytes(self) -> usize {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
            ValueType::U16 | ValueType::I16 => 2,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
            ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::String => 8,
            ValueType::Array => 12,
        }
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// Element type (kept for empty arrays) and elements, all of that type.
    Array(ValueType, Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(..) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer value, widened.
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(_, v) => Some(v),
            _ => None,
        }
    }
}

/// Short display: scalars in full, strings quoted (long ones cut), arrays as their type, length and first items.
impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::String(s) if s.chars().count() > 80 => {
                let head: String = s.chars().take(77).collect();
                write!(f, "{head:?}... ({} bytes)", s.len())
            }
            Value::String(s) => write!(f, "{s:?}"),
            Value::Array(t, items) => {
                write!(f, "[{t:?} x {}:", items.len())?;
                for item in items.iter().take(4) {
                    write!(f, " {item}")?;
                }
                if items.len() > 4 {
                    write!(f, " ...")?;
                }
                write!(f, "]")
            }
        }
    }
}

/// Conversion from a metadata value, for [`GgufFile::get`]. Integers convert between widths when the value fits.
pub trait FromValue<'a>: Sized {
    /// What the caller expected, for error messages.
    fn expected() -> String;
    fn from_value(v: &'a Value) -> Option<Self>;
}

macro_rules! int_from_value {
    ($($t:ty => $what:literal),*) => {$(
        impl<'a> FromValue<'a> for $t {
            fn expected() -> String {
                $what.into()
            }
            fn from_value(v: &'a Value) -> Option<Self> {
                v.as_int().and_then(|i| <$t>::try_from(i).ok())
            }
        }
    )*};
}
int_from_value!(u8 => "an integer in u8 range", u16 => "an integer in u16 range", u32 => "an integer in u32 range",
    u64 => "an integer in u64 range", usize => "a non-negative integer", i32 => "an integer in i32 range",
    i64 => "an integer in i64 range");

impl<'a> FromValue<'a> for f32 {
    fn expected() -> String {
        "a float".into()
    }
    fn from_value(v: &'a Value) -> Option<Self> {
        match *v {
            Value::F32(x) => Some(x),
            Value::F64(x) => Some(x as f32),
            _ => None,
        }
    }
}

impl<'a> FromValue<'a> for f64 {
    fn expected() -> String {
        "a float".into()
    }
    fn from_value(v: &'a Value) -> Option<Self> {
        match *v {
            Value::F32(x) => Some(x.into()),
            Value::F64(x) => Some(x),
            _ => None,
        }
    }
}

impl<'a> FromValue<'a> for bool {
    fn expected() -> String {
        "a bool".into()
    }
    fn from_value(v: &'a Value) -> Option<Self> {
        v.as_bool()
    }
}

impl<'a> FromValue<'a> for &'a str {
    fn expected() -> String {
        "a string".into()
    }
    fn from_value(v: &'a Value) -> Option<Self> {
        v.as_str()
    }
}

impl<'a> FromValue<'a> for &'a Value {
    fn expected() -> String {
        "a value".into()
    }
    fn from_value(v: &'a Value) -> Option<Self> {
        Some(v)
    }
}

impl<'a, T: FromValue<'a>> FromValue<'a> for Vec<T> {
    fn expected() -> String {
        format!(
            "an array of {}s",
            T::expected().trim_start_matches("an ").trim_start_matches("a ")
        )
    }
    fn from_value(v: &'a Value) -> Option<Self> {
        v.as_array()?.iter().map(T::from_value).collect()
    }
}
