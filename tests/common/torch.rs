//! Files as PyTorch's `torch.save` writes them, byte for byte: a stored zip archive (`data.pkl` in pickle protocol
//! 2, `byteorder`, `data/<key>`, `version`) and the pickle opcodes torch emits for tensors and state dicts.

#![allow(dead_code)]

/// A zip archive of `entries`, stored (method 0), as torch's writer lays it out.
pub fn stored_zip(entries: &[(String, Vec<u8>)]) -> Vec<u8> {
    let (mut out, mut central) = (Vec::new(), Vec::new());
    let le16 = |v: &mut Vec<u8>, x: u16| v.extend_from_slice(&x.to_le_bytes());
    let le32 = |v: &mut Vec<u8>, x: u32| v.extend_from_slice(&x.to_le_bytes());
    for (name, data) in entries {
        let offset = out.len() as u32;
        le32(&mut out, 0x0403_4b50);
        for x in [20u16, 0, 0, 0, 0] {
            le16(&mut out, x);
        }
        le32(&mut out, 0); // crc (not checked)
        le32(&mut out, data.len() as u32);
        le32(&mut out, data.len() as u32);
        le16(&mut out, name.len() as u16);
        le16(&mut out, 0);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);
        le32(&mut central, 0x0201_4b50);
        for x in [20u16, 20, 0, 0, 0, 0] {
            le16(&mut central, x);
        }
        le32(&mut central, 0);
        le32(&mut central, data.len() as u32);
        le32(&mut central, data.len() as u32);
        le16(&mut central, name.len() as u16);
        for x in [0u16, 0, 0, 0] {
            le16(&mut central, x);
        }
        le32(&mut central, 0);
        le32(&mut central, offset);
        central.extend_from_slice(name.as_bytes());
    }
    let cd = out.len() as u32;
    out.extend_from_slice(&central);
    le32(&mut out, 0x0605_4b50);
    for x in [0u16, 0, entries.len() as u16, entries.len() as u16] {
        le16(&mut out, x);
    }
    le32(&mut out, central.len() as u32);
    le32(&mut out, cd);
    le16(&mut out, 0);
    out
}

/// Protocol-2 pickle bytes, with torch's memo puts.
#[derive(Default)]
pub struct Pickle {
    pub b: Vec<u8>,
    memo: u8,
}

impl Pickle {
    pub fn put(&mut self) {
        self.b.extend([b'q', self.memo]);
        self.memo += 1;
    }
    pub fn global(&mut self, module: &str, name: &str) {
        self.b.extend(format!("c{module}\n{name}\n").bytes());
        self.put();
    }
    pub fn str(&mut self, s: &str) {
        self.b.push(b'X');
        self.b.extend((s.len() as u32).to_le_bytes());
        self.b.extend(s.bytes());
        self.put();
    }
    pub fn int(&mut self, v: usize) {
        match v {
            0..=255 => self.b.extend([b'K', v as u8]),
            256..=65535 => {
                self.b.push(b'M');
                self.b.extend((v as u16).to_le_bytes());
            }
            _ => {
                self.b.push(b'J');
                self.b.extend((v as i32).to_le_bytes());
            }
        }
    }
    pub fn tuple(&mut self, vs: &[usize]) {
        match vs.len() {
            1 => {
                self.int(vs[0]);
                self.b.push(0x85);
            }
            2 => {
                self.int(vs[0]);
                self.int(vs[1]);
                self.b.push(0x86);
            }
            _ => {
                self.b.push(b'(');
                vs.iter().for_each(|&v| self.int(v));
                self.b.push(b't');
            }
        }
        self.put();
    }
    /// `_rebuild_tensor_v2(storage key of type `storage`, 0, shape, contiguous strides, False, OrderedDict())`.
    pub fn tensor(&mut self, key: &str, storage: &str, shape: &[usize]) {
        self.global("torch._utils", "_rebuild_tensor_v2");
        self.b.push(b'(');
        self.b.push(b'(');
        self.str("storage");
        self.global("torch", storage);
        self.str(key);
        self.str("cpu");
        self.int(shape.iter().product());
        self.b.push(b't');
        self.put();
        self.b.push(b'Q');
        self.int(0);
        self.tuple(shape);
        let strides: Vec<usize> = (0..shape.len()).map(|i| shape[i + 1..].iter().product()).collect();
        self.tuple(&strides);
        self.b.push(0x89);
        self.global("collections", "OrderedDict");
        self.b.extend([b')', b'R']);
        self.put();
        self.b.push(b't');
        self.put();
        self.b.push(b'R');
        self.put();
    }
}

/// A torch.save archive named `stem` of pickle `pkl` and storages `data/0..`.
pub fn torch_file(stem: &str, pkl: Vec<u8>, storages: Vec<Vec<u8>>) -> Vec<u8> {
    let mut entries = vec![
        (format!("{stem}/data.pkl"), pkl),
        (format!("{stem}/byteorder"), b"little".to_vec()),
    ];
    for (i, s) in storages.into_iter().enumerate() {
        entries.push((format!("{stem}/data/{i}"), s));
    }
    entries.push((format!("{stem}/version"), b"3\n".to_vec()));
    stored_zip(&entries)
}

pub fn freq_file(ids: &[i64]) -> Vec<u8> {
    let mut p = Pickle::default();
    p.b.extend([0x80, 2]);
    p.tensor("0", "LongStorage", &[ids.len()]);
    p.b.push(b'.');
    torch_file("freq_8", p.b, vec![bytemuck::cast_slice(ids).to_vec()])
}
