//go:build tools

// Package tools pins the Knative Eventing commands vmevents runs, built unchanged from their published module:
// `go build knative.dev/eventing/cmd/...` inside this module uses the version and sums recorded here
// (`go install …@version` fails: the proxy refuses the module's version list). These are the commands of the
// multi-tenant channel-based broker with the in-memory channel (config/brokers/mt-channel-broker,
// config/channels/in-memory-channel), the core controller and webhook (config/core), PingSource's adapter
// and ApiServerSource's adapter.
package tools

import (
	_ "knative.dev/eventing/cmd/apiserver_receive_adapter"
	_ "knative.dev/eventing/cmd/broker/filter"
	_ "knative.dev/eventing/cmd/broker/ingress"
	_ "knative.dev/eventing/cmd/controller"
	_ "knative.dev/eventing/cmd/in_memory/channel_controller"
	_ "knative.dev/eventing/cmd/in_memory/channel_dispatcher"
	_ "knative.dev/eventing/cmd/mtchannel_broker"
	_ "knative.dev/eventing/cmd/mtping"
	_ "knative.dev/eventing/cmd/webhook"
)
