package poller

// PlantNoYieldPace plants a bug in g (before Run): spinners yield at every
// look at the clock, as before GroupConfig.SpinYield.
func PlantNoYieldPace(g *Group) { g.noYieldPace = true }
