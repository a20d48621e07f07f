package send_test

import (
	"fmt"
	"time"

	"github.com/fluxora/fluxhook/stages/send"
)

func ExampleValidateURL() {
	for _, raw := range []string{
		"https://consumer.example/hooks?token=abc",
		"http://localhost:3000/hooks",
		"http://consumer.example/hooks",
		"https://user:pass@consumer.example/hooks",
	} {
		fmt.Println(send.ValidateURL(raw))
	}
	// Output:
	// <nil>
	// <nil>
	// invalid endpoint URL: http:// is allowed only for loopback hosts (localhost, 127.0.0.0/8, ::1); use https://
	// invalid endpoint URL: it contains a user name or password; remove them, consumers authenticate requests by their signature
}

func ExampleClassify() {
	for _, status := range []int{204, 302, 404, 410, 413, 503} {
		fmt.Println(status, send.Classify(status, send.DefaultPermanentStatuses))
	}
	// Output:
	// 204 delivered
	// 302 retry
	// 404 retry
	// 410 permanent
	// 413 permanent
	// 503 retry
}

func ExampleParseRetryAfter() {
	now := time.Date(2024, 3, 10, 12, 0, 0, 0, time.UTC)
	fmt.Println(send.ParseRetryAfter("120", now))
	fmt.Println(send.ParseRetryAfter("Sun, 10 Mar 2024 12:05:00 GMT", now))
	fmt.Println(send.ParseRetryAfter("soon", now))
	// Output:
	// 2m0s true
	// 5m0s true
	// 0s false
}

func ExampleParseAllowedNetworks() {
	nets, err := send.ParseAllowedNetworks("10.1.0.0/16, fd00::/8 192.168.1.20")
	fmt.Println(nets, err)
	_, err = send.ParseAllowedNetworks("10.1.0.0/16, intranet")
	fmt.Println(err)
	// Output:
	// [10.1.0.0/16 fd00::/8 192.168.1.20/32] <nil>
	// WEBHOOK_ALLOWED_NETWORKS: "intranet" is neither a network in CIDR form nor an IP address; use e.g. 10.1.0.0/16, fd00::/8 or 192.168.1.20
}
