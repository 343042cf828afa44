//! The entries of a zip archive whose members are stored uncompressed (what `torch.save` writes), read from a
//! memory map: the end-of-central-directory record (zip64 too), the central directory, each entry's local header.

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

/// A zip archive's stored entries: name -> byte range of its data in `bytes`.
pub struct StoredZip {
    pub entries: HashMap<String, Range<usize>>,
}

fn bytes_at(b: &[u8], at: usize, n: usize) -> Option<&[u8]> {
    b.get(at..at.checked_add(n)?)
}
fn u16_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u16::from_le_bytes(bytes_at(b, at, 2)?.try_into().ok()?) as u64)
}
fn u32_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u32::from_le_bytes(bytes_at(b, at, 4)?.try_into().ok()?) as u64)
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes_at(b, at, 8)?.try_into().ok()?))
}

impl StoredZip {
    /// Index `bytes`, the whole archive at `path` (named in errors). Compressed entries are an error.
    pub fn index(bytes: &[u8], path: &Path) -> Result<StoredZip> {
        let bad = |why: &str| Error::File {
            path: path.into(),
            message: format!("not a readable zip archive: {why}"),
        };
        let from = bytes.len().saturating_sub(22 + 65535);
        let eocd = (from..bytes.len().saturating_sub(21))
            .rev()
            .find(|&i| bytes[i..i + 4] == [0x50, 0x4b, 0x05, 0x06])
            .ok_or_else(|| bad("no end of central directory"))?;
        let mut count = u16_at(bytes, eocd + 10).ok_or_else(|| bad("truncated"))?;
        let mut cd = u32_at(bytes, eocd + 16).ok_or_else(|| bad("truncated"))?;
        if count == 0xffff || cd == 0xffff_ffff {
            // Zip64: the locator just before the record points at the zip64 record.
            let loc = eocd.checked_sub(20).ok_or_else(|| bad("no zip64 locator"))?;
            if bytes_at(bytes, loc, 4) != Some(&[0x50, 0x4b, 0x06, 0x07]) {
                return Err(bad("no zip64 locator"));
            }
            let rec = u64_at(bytes, loc + 8).ok_or_else(|| bad("truncated"))? as usize;
            if bytes_at(bytes, rec, 4) != Some(&[0x50, 0x4b, 0x06, 0x06]) {
                return Err(bad("bad zip64 record"));
            }
            count = u64_at(bytes, rec + 32).ok_or_else(|| bad("truncated"))?;
            cd = u64_at(bytes, rec + 48).ok_or_else(|| bad("truncated"))?;
        }
        let mut entries = HashMap::new();
        let mut at = usize::try_from(cd).map_err(|_| bad("central directory offset"))?;
        for _ in 0..count {
            if at > bytes.len() {
                return Err(bad("truncated central directory"));
            }
            let field = |off: usize, len: usize| -> Result<u64> {
                let v = if len == 2 {
                    u16_at(bytes, at + off)
                } else {
                    u32_at(bytes, at + off)
                };
                v.ok_or_else(|| bad("truncated central directory"))
            };
            if bytes_at(bytes, at, 4) != Some(&[0x50, 0x4b, 0x01, 0x02]) {
                return Err(bad("bad central directory entry"));
            }
            let (method, mut size) = (field(10, 2)?, field(24, 4)?);
            let (name_len, extra_len, comment_len) =
                (field(28, 2)? as usize, field(30, 2)? as usize, field(32, 2)? as usize);
            let mut local = field(42, 4)?;
            let name = bytes
                .get(at + 46..at + 46 + name_len)
                .ok_or_else(|| bad("truncated name"))?;
            let name = String::from_utf8_lossy(name).into_owned();
            // Zip64 extra field: the 0xffffffff values in order (uncompressed, compressed size, local offset).
            let mut e = at + 46 + name_len;
            let extra_end = e + extra_len;
            while e + 4 <= extra_end {
                let (id, len) = (
                    u16_at(bytes, e).unwrap_or(0),
                    u16_at(bytes, e + 2).unwrap_or(0) as usize,
                );
                if id == 1 {
                    let mut p = e + 4;
                    if size == 0xffff_ffff {
                        size = u64_at(bytes, p).ok_or_else(|| bad("truncated zip64 field"))?;
                        p += 8;
                    }
                    if field(20, 4)? == 0xffff_ffff {
                        p += 8;
                    }
                    if local == 0xffff_ffff {
                        local = u64_at(bytes, p).ok_or_else(|| bad("truncated zip64 field"))?;
                    }
                }
                e += 4 + len;
            }
            if method != 0 {
                return Err(bad(&format!(
                    "entry {name} is compressed (method {method}); only stored entries are read"
                )));
            }
            let l = usize::try_from(local).unwrap_or(usize::MAX);
            if bytes_at(bytes, l, 4) != Some(&[0x50, 0x4b, 0x03, 0x04]) {
                return Err(bad(&format!("entry {name}: bad local header")));
            }
            let data =
                l + 30 + u16_at(bytes, l + 26).unwrap_or(0) as usize + u16_at(bytes, l + 28).unwrap_or(0) as usize;
            let end = data.checked_add(size as usize).filter(|&end| end <= bytes.len());
            let end = end.ok_or_else(|| bad(&format!("entry {name} runs past the end of the file")))?;
            entries.insert(name, data..end);
            at = extra_end + comment_len;
        }
        Ok(StoredZip { entries })
    }
}
