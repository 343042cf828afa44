//! PyTorch `torch.save` files read by the restricted reader, written here byte for byte as torch 2 writes them
//! (a stored zip archive with `data.pkl` in pickle protocol 2, `byteorder` and `data/<key>`): FR-Spec's
//! `freq_N.pt` (a 1-D LongTensor of token ids) and an EAGLE-1 head's `pytorch_model.bin` (an OrderedDict state dict
//! with `_metadata`), which must load and compute what the same head in safetensors computes, bit for bit.
//! Hostile or malformed files (a global that is not a tensor rebuild, a truncated pickle, a compressed entry, a
//! storage too small) are errors that name the file.

mod common;

use common::torch::{freq_file, torch_file, Pickle};
use shaderlm::generate::Generator;
use shaderlm::loader::torch_pickle;
use shaderlm::model::eagle_fit::write_head;
use shaderlm::model::{frspec, Llama, StepOutputs};
use std::path::Path;

#[test]
fn frspec_freq_files_are_read_and_bad_ones_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("freq_8.pt");
    let ids = [7i64, 3, 100, 2, 9, 0, 1, 5];
    std::fs::write(&path, freq_file(&ids)).unwrap();
    assert_eq!(frspec::read_ranking(&path).unwrap(), [7, 3, 100, 2, 9, 0, 1, 5]);
    let refused = |bytes: Vec<u8>, want: &str| {
        std::fs::write(&path, bytes).unwrap();
        let e = frspec::read_ranking(&path).unwrap_err().to_string();
        assert!(e.contains("freq_8.pt") && e.contains(want), "want {want:?}: {e}");
    };
    // A negative id, a hostile global, a truncated pickle, a storage shorter than the tensor, a compressed entry.
    refused(freq_file(&[1, -2]), "-2");
    let mut p = Pickle::default();
    p.b.extend([0x80, 2]);
    p.global("os", "system");
    p.str("echo hi");
    p.b.extend([0x85, b'R', b'.']);
    refused(torch_file("freq_8", p.b, vec![]), "os.system");
    let good = freq_file(&ids);
    let mut cut = Pickle::default();
    cut.b.extend([0x80, 2]);
    cut.tensor("0", "LongStorage", &[8]);
    cut.b.truncate(cut.b.len() - 5);
    refused(torch_file("freq_8", cut.b, vec![vec![0; 64]]), "truncated");
    let mut p = Pickle::default();
    p.b.extend([0x80, 2]);
    p.tensor("0", "LongStorage", &[8]);
    p.b.push(b'.');
    refused(torch_file("freq_8", p.b, vec![vec![0; 24]]), "past the end");
    // Containers nested 100 deep (a stack overflow when dropped, were they built) and one too large to memoize.
    let mut deep = Pickle::default();
    deep.b.extend([0x80, 2, b'K', 1]);
    deep.b.extend(std::iter::repeat_n(0x85, 100));
    deep.b.push(b'.');
    refused(torch_file("freq_8", deep.b, vec![]), "nested deeper");
    let mut compressed = good.clone();
    let at = compressed
        .windows(4)
        .rposition(|w| w == [0x50, 0x4b, 0x01, 0x02])
        .unwrap();
    compressed[at + 10] = 8; // deflate, in the last central directory entry
    refused(compressed, "compressed");
}

/// The EAGLE-1 head written by `write_head` (safetensors) again as `pytorch_model.bin`: a state dict in an
/// OrderedDict with `_metadata`, storages shared through the memo as torch does.
fn head_as_pickle(st_dir: &Path, out_dir: &Path) {
    let st = shaderlm::loader::safetensors::SafetensorsModel::open(st_dir).unwrap();
    let mut names: Vec<String> = st.names().map(str::to_string).collect();
    names.sort();
    let mut p = Pickle::default();
    p.b.extend([0x80, 2]);
    p.global("collections", "OrderedDict");
    p.b.extend([b')', b'R']);
    p.put();
    p.b.push(b'(');
    let mut storages = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let (shape, v) = st.f32(name).unwrap().unwrap();
        p.str(name);
        p.tensor(&i.to_string(), "FloatStorage", &shape);
        storages.push(bytemuck::cast_slice(&v).to_vec());
    }
    p.b.push(b'u');
    // BUILD with the state {'_metadata': {}} as torch's state dicts carry.
    p.b.push(b'}');
    p.put();
    p.str("_metadata");
    p.b.push(b'}');
    p.put();
    p.b.extend([b's', b'b', b'.']);
    std::fs::create_dir_all(out_dir).unwrap();
    std::fs::write(out_dir.join("pytorch_model.bin"), torch_file("archive", p.b, storages)).unwrap();
    std::fs::copy(st_dir.join("config.json"), out_dir.join("config.json")).unwrap();
}

#[test]
fn an_eagle_head_as_pytorch_model_bin_loads_and_computes_what_its_safetensors_does() {
    let (gpu, loaded) = common::golden::load("SmolLM2-135M-Instruct.Q4_1.gguf", "");
    let t = &loaded.model.cfg;
    let h = t.hidden;
    let dir = tempfile::tempdir().unwrap();
    let st_dir = dir.path().join("st");
    let fc = common::rng::Rng::new(5).vec(2 * h * h, 0.05);
    write_head(&st_dir, t, &fc, &common::rng::Rng::new(6).vec(h, 0.1)).unwrap();
    let pkl_dir = dir.path().join("pkl");
    head_as_pickle(&st_dir, &pkl_dir);
    let read = torch_pickle::read(&pkl_dir.join("pytorch_model.bin")).unwrap();
    assert!(
        read.iter().any(|(n, t)| n == "fc.weight" && t.shape == [h, 2 * h]),
        "{:?}",
        read.iter().map(|x| &x.0).collect::<Vec<_>>()
    );
    let out = StepOutputs {
        logits: true,
        hidden: true,
        ..Default::default()
    };
    let features = common::rng::Rng::new(7).vec(3 * h, 1.0);
    let run = |dir: &Path| {
        let head = Llama::load_eagle(&gpu, dir, &loaded.model).unwrap();
        let mut g = Generator::new(&gpu, &head, 64, out).unwrap();
        g.feed_with(&[5, 17, 300], &features).unwrap();
        (g.result.logits.clone(), g.result.hidden.clone())
    };
    let (a, b) = (run(&st_dir), run(&pkl_dir));
    assert!(a.0.iter().zip(&b.0).all(|(x, y)| x.to_bits() == y.to_bits()) && a.0.len() == b.0.len());
    assert!(a.1.iter().zip(&b.1).all(|(x, y)| x.to_bits() == y.to_bits()) && a.1.len() == b.1.len());
}
