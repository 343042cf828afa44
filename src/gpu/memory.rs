//! What an adapter reports about its memory, for the model's memory budget: its largest device-local heap (Vulkan
//! reports heap sizes; wgpu's portable API reports none), and for a CPU adapter (lavapipe, llvmpipe) the host's
//! available memory, which its buffers live in.

/// An adapter's memory as far as it is known; `None` where the backend or the OS reports nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    /// The adapter's name, for messages.
    pub adapter: String,
    /// Bytes of its largest device-local heap (`VkMemoryHeap::size`; Vulkan only).
    pub device_heap: Option<u64>,
    /// The host's available memory (`MemAvailable` on Linux), for CPU adapters only.
    pub host_available: Option<u64>,
    /// The largest single buffer the adapter allows (`max_buffer_size`).
    pub max_buffer: u64,
}

impl MemoryReport {
    pub fn of(adapter: &wgpu::Adapter) -> MemoryReport {
        let info = adapter.get_info();
        MemoryReport {
            device_heap: vulkan_device_heap(adapter),
            host_available: (info.device_type == wgpu::DeviceType::Cpu)
                .then(host_available)
                .flatten(),
            max_buffer: adapter.limits().max_buffer_size,
            adapter: info.name,
        }
    }

    /// The most memory a model may use on this adapter, and where that figure comes from: for a CPU adapter the
    /// host's available memory, where its buffers live (its heap size is no measure: lavapipe 22.3 reports 2 GiB on
    /// any machine); else the device-local heap; `None` when neither is reported.
    pub fn limit(&self) -> Option<(u64, String)> {
        if let Some(b) = self.host_available {
            let what = format!("the host's available memory (the CPU adapter {})", self.adapter);
            return Some((b, what));
        }
        self.device_heap
            .map(|b| (b, format!("the device-local memory of {}", self.adapter)))
    }
}

/// The size of the adapter's largest device-local Vulkan heap, or `None` on other backends.
#[cfg(all(not(target_arch = "wasm32"), not(target_vendor = "apple")))]
fn vulkan_device_heap(adapter: &wgpu::Adapter) -> Option<u64> {
    /// `VK_MEMORY_HEAP_DEVICE_LOCAL_BIT`.
    const DEVICE_LOCAL: u32 = 1;
    // SAFETY: a read-only query with the adapter's own handles, which outlive the guard; nothing is created or
    // destroyed.
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
    let props = unsafe {
        hal.shared_instance()
            .raw_instance()
            .get_physical_device_memory_properties(hal.raw_physical_device())
    };
    props
        .memory_heaps_as_slice()
        .iter()
        .filter(|h| h.flags.as_raw() & DEVICE_LOCAL != 0)
        .map(|h| h.size)
        .max()
}

#[cfg(any(target_arch = "wasm32", target_vendor = "apple"))]
fn vulkan_device_heap(_adapter: &wgpu::Adapter) -> Option<u64> {
    None
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn host_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&text)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn host_available() -> Option<u64> {
    None
}

/// The `MemAvailable:   123 kB` line of a meminfo text, in bytes.
fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let kib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_in_bytes() {
        let text = "MemTotal:       24683584 kB\nMemFree:  1 kB\nMemAvailable:   21909904 kB\n";
        assert_eq!(parse_mem_available(text), Some(21909904 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: lots\n"), None);
    }

    #[test]
    fn the_limit_is_host_memory_for_cpu_adapters_else_the_heap() {
        let mut r = MemoryReport {
            adapter: "llvmpipe".into(),
            device_heap: Some(2 << 30),
            host_available: Some(20 << 30),
            max_buffer: 1 << 31,
        };
        let (bytes, by) = r.limit().unwrap();
        assert_eq!(bytes, 20 << 30);
        assert!(by.contains("host") && by.contains("llvmpipe"), "{by}");
        r.host_available = None;
        let (bytes, by) = r.limit().unwrap();
        assert_eq!(bytes, 2 << 30);
        assert!(by.contains("device-local"), "{by}");
        r.device_heap = None;
        assert_eq!(r.limit(), None);
    }
}
