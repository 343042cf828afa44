//! `shaderlm serve`: the OpenAI-compatible HTTP server (`shaderlm::server`) on the model the flags name.

use super::common::ModelArgs;
use super::DeviceArgs;
use clap::Args;
use shaderlm::server::{self, ServerOptions};
use std::time::Duration;

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port; 0 picks a free one (the address is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every request but /health.
    #[arg(long, env = "SHADERLM_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Requests generating at once, each in its own session (a KV cache of --ctx positions).
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Requests that may wait for a session; past that a request gets 503.
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// Largest request body in bytes (413 past it).
    #[arg(long, default_value_t = 8 << 20)]
    pub max_body: usize,
    /// Most seconds a request may take, waiting for a session included.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Speculative decoding with up to N prompt-lookup drafts per step (the output is unchanged; answers that
    /// quote the prompt, such as code edits, come faster); 0 turns it off.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub spec_lookup: usize,
    /// The model's id in requests and /v1/models [default: the file or directory name without .gguf].
    #[arg(long)]
    pub model_id: Option<String>,
}

pub fn run(args: &ServeArgs, device: &DeviceArgs) -> anyhow::Result<()> {
    let path = args.model.path()?;
    let model_id = match &args.model_id {
        Some(id) => id.clone(),
        None => {
            let name = path
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
            name.strip_suffix(".gguf").unwrap_or(&name).to_string()
        }
    };
    let opts = ServerOptions {
        host: args.host.clone(),
        port: args.port,
        api_key: args.api_key.clone(),
        model_id,
        parallel: args.parallel,
        queue: args.queue,
        max_body: args.max_body,
        timeout: Duration::from_secs(args.timeout),
        chunk: args.model.chunk,
        lookup: args.spec_lookup,
    };
    opts.check()?;
    let (gpu, loaded) = args.model.load_sessions(device, args.parallel)?;
    let summary = format!(
        "{} ({}) on {}: up to {} sessions of {} tokens",
        opts.model_id,
        loaded.format,
        gpu.describe(),
        args.parallel,
        loaded.ctx
    );
    server::run(gpu, loaded, opts, |addr| {
        eprintln!("{summary}");
        eprintln!("listening on http://{addr} (OpenAI API under /v1; Ctrl-C stops)");
    })?;
    Ok(())
}
