//! A writer of Python pickles (protocol 2) for the few kinds of value a memory snapshot holds:
//! dicts with string keys, lists, tuples, strings, integers and booleans.
//!
//! Written here rather than taken from a crate: the snapshot needs eight opcodes, and the
//! crates that write pickles (serde-pickle) would bring serde and big integers into the
//! dependencies of a C library for them. Python's own `pickle` reads the output in the tests.

/// A value to pickle.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Bool(bool),
    Int(i128),
    Str(String),
    List(Vec<Value>),
    Tuple(Vec<Value>),
    /// Keys in the order given (a Python dict keeps insertion order).
    Dict(Vec<(&'static str, Value)>),
}

impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::Int(v as i128)
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Value {
        Value::Int(v as i128)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Bool(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Str(v.to_string())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Str(v)
    }
}

/// `value` as a protocol-2 pickle.
pub fn to_bytes(value: &Value) -> Vec<u8> {
    let mut out = vec![0x80, 2]; // PROTO 2
    write(&mut out, value);
    out.push(b'.'); // STOP
    out
}

fn write(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Bool(true) => out.push(0x88),
        Value::Bool(false) => out.push(0x89),
        Value::Int(v) => write_int(out, *v),
        Value::Str(s) => write_str(out, s),
        Value::List(items) => {
            out.push(b']'); // EMPTY_LIST
            if !items.is_empty() {
                out.push(b'('); // MARK
                for item in items {
                    write(out, item);
                }
                out.push(b'e'); // APPENDS
            }
        }
        Value::Tuple(items) => {
            out.push(b'('); // MARK
            for item in items {
                write(out, item);
            }
            out.push(b't'); // TUPLE
        }
        Value::Dict(entries) => {
            out.push(b'}'); // EMPTY_DICT
            if !entries.is_empty() {
                out.push(b'('); // MARK
                for (key, item) in entries {
                    write_str(out, key);
                    write(out, item);
                }
                out.push(b'u'); // SETITEMS
            }
        }
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'X'); // BINUNICODE: 4-byte little-endian length, UTF-8
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_int(out: &mut Vec<u8>, v: i128) {
    if let Ok(small) = i32::try_from(v) {
        out.push(b'J'); // BININT: 4-byte little-endian signed
        out.extend_from_slice(&small.to_le_bytes());
        return;
    }
    // LONG1: length byte, then the shortest little-endian two's complement.
    let bytes = v.to_le_bytes();
    let mut n = bytes.len();
    while n > 1 {
        let (top, below) = (bytes[n - 1], bytes[n - 2]);
        let redundant = (top == 0 && below & 0x80 == 0) || (top == 0xff && below & 0x80 != 0);
        if !redundant {
            break;
        }
        n -= 1;
    }
    out.push(0x8a);
    out.push(n as u8);
    out.extend_from_slice(&bytes[..n]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_have_their_opcodes() {
        assert_eq!(to_bytes(&Value::Bool(false)), vec![0x80, 2, 0x89, b'.']);
        assert_eq!(
            to_bytes(&Value::Int(-2)),
            vec![0x80, 2, b'J', 0xfe, 0xff, 0xff, 0xff, b'.']
        );
        assert_eq!(
            to_bytes(&Value::from("é")),
            vec![0x80, 2, b'X', 2, 0, 0, 0, 0xc3, 0xa9, b'.']
        );
    }

    #[test]
    fn large_integers_take_the_fewest_bytes() {
        // 2^31 needs a fifth byte for its sign; 2^63 + 1 a ninth.
        assert_eq!(
            to_bytes(&Value::Int(1 << 31)),
            vec![0x80, 2, 0x8a, 5, 0, 0, 0, 0x80, 0, b'.']
        );
        let big = to_bytes(&Value::from((1u64 << 63) + 1));
        assert_eq!(big[2..4], [0x8a, 9]);
        assert_eq!(big[4..13], [1, 0, 0, 0, 0, 0, 0, 0x80, 0]);
        assert_eq!(
            to_bytes(&Value::Int(-(1 << 40))),
            vec![0x80, 2, 0x8a, 6, 0, 0, 0, 0, 0, 0xff, b'.']
        );
    }

    #[test]
    fn containers_mark_their_items() {
        let v = Value::Dict(vec![
            (
                "a",
                Value::List(vec![Value::Bool(true), Value::List(vec![])]),
            ),
            ("b", Value::Tuple(vec![Value::Int(0), Value::Int(1)])),
        ]);
        let b = to_bytes(&v);
        assert_eq!(b[2], b'}');
        assert_eq!(b[3], b'(');
        assert_eq!(*b.iter().rev().nth(1).unwrap(), b'u');
        assert!(b.windows(2).any(|w| w == [0x88, b']']), "{b:?}");
    }
}
