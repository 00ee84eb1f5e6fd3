//! An exchange with no GPU rank ([`NullExchange`]), for what drives an exchange without a GPU:
//! the jitter and fault wrapper's CPU tests, `halo selftest`. Public with feature `diagnostics`.

use std::sync::Arc;

/// An [`Exchange`](super::Exchange) with no GPU rank: it records the calls it gets and does
/// nothing else. For running code that drives an exchange where there is no GPU: the jitter and
/// fault wrapper ([`super::perturb::Perturbed`]) in CPU tests and in `halo selftest`, `halo launch`
/// with an injected fault.
#[derive(Clone, Debug, Default)]
pub struct NullExchange {
    /// Every call so far, in order: `forward`, `reverse`, `finish`, `barrier`, `reset`, `replan`.
    pub calls: Vec<&'static str>,
    /// What [`crate::exchange::Exchange::routes`] returns.
    pub routes: Vec<crate::route::RoutedSummary>,
}

impl super::Exchange for NullExchange {
    fn local_ranks(&self) -> &[super::RankExchange] {
        &[]
    }
    fn local_ranks_mut(&mut self) -> &mut [super::RankExchange] {
        &mut []
    }
    fn streams(&self) -> &[Arc<crate::gpu::CudaStream>] {
        &[]
    }
    fn check_transport(&self, _: crate::desc::Transport) -> crate::Result<()> {
        Ok(())
    }
    fn exchange_forward(&mut self, _: crate::desc::Transport) -> crate::Result<()> {
        self.calls.push("forward");
        Ok(())
    }
    fn exchange_reverse_accumulate(&mut self, _: crate::desc::Transport) -> crate::Result<()> {
        self.calls.push("reverse");
        Ok(())
    }
    fn finish(&mut self) -> crate::Result<()> {
        self.calls.push("finish");
        Ok(())
    }
    fn use_streams(&mut self, streams: &[Arc<crate::gpu::CudaStream>]) -> crate::Result<()> {
        match streams {
            [] => Ok(()),
            _ => Err(crate::HaloError::InvalidInput(format!("{} streams for an exchange with no rank", streams.len()))),
        }
    }
    fn barrier(&self) -> crate::Result<()> {
        Ok(())
    }
    fn host_syncs(&self) -> u64 {
        self.calls.len() as u64
    }
    fn reset_protocol(&mut self) -> crate::Result<()> {
        self.calls.push("reset");
        Ok(())
    }
    fn replan(&mut self, _: Vec<crate::desc::RankHalo>) -> crate::Result<bool> {
        self.calls.push("replan");
        Ok(true)
    }
    fn fits(&self, _: &[crate::desc::RankHalo]) -> bool {
        true
    }
    fn routes(&self) -> Vec<crate::route::RoutedSummary> {
        self.routes.clone()
    }
}
