package server

// PlantDropBalanceLoad plants the dropBalanceLoad bug (Options) in o:
// the balancer of the replicas Run starts gets the config's interval but
// not its balance_min_writes and balance_split_keys.
func PlantDropBalanceLoad(o *Options) { o.dropBalanceLoad = true }
