package inbox

// Consumer is the consumer whose rows the processor works on: the label its metrics carry.
func (p *Processor) Consumer() string { return p.config.Consumer }

// Consumer is the consumer the receiver stores rows for: the label its metrics carry.
func (r *Receiver) Consumer() string { return r.config.Consumer }
