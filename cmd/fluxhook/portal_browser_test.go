package main

// The portal driven in a real browser: Debian's headless Chromium, through chromedp, against
// `fluxhook serve` with API_ADDR, as a tenant's people use it.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/sign"
)

// chromiumPath is Debian's chromium, which .ci/services installs; FLUXHOOK_CHROMIUM names
// another build.
func chromiumPath(t *testing.T) string {
	t.Helper()
	path := os.Getenv("FLUXHOOK_CHROMIUM")
	if path == "" {
		path = "/usr/bin/chromium"
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("no Chromium at %s (%v): run .ci/services, which installs Debian's chromium package, or set FLUXHOOK_CHROMIUM", path, err)
	}
	return path
}

// portalConsumer is a webhook consumer that verifies each request's signature with the secret
// the portal showed (set once the test has read it from the page) and answers status.
type portalConsumer struct {
	srv    *httptest.Server
	mu     sync.Mutex
	secret string
	status int
	got    []portalHook
}

// portalHook is one request the consumer answered.
type portalHook struct {
	DeliveryID, Event string
	Verified          error
	Status            int
}

// newPortalConsumer starts a consumer on loopback, closed at cleanup; it answers 401 (a failed
// verification) until set gives it the secret.
func newPortalConsumer(t *testing.T) *portalConsumer {
	t.Helper()
	c := &portalConsumer{status: http.StatusOK}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		c.mu.Lock()
		defer c.mu.Unlock()
		h := portalHook{DeliveryID: r.Header.Get(sign.HeaderDeliveryID), Event: r.Header.Get("x-fluxora-event"),
			Verified: sign.VerifyFluxora(r.Header, body, time.Now(), 0, []byte(c.secret)), Status: c.status}
		if h.Verified != nil {
			h.Status = http.StatusUnauthorized
		}
		c.got = append(c.got, h)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(h.Status)
		// An answer with a body, as consumers send: the portal shows its start with each attempt.
		if h.Status >= 300 {
			_, _ = w.Write([]byte(`{"error": "the ledger is read-only during a deploy"}`))
		} else {
			_, _ = w.Write([]byte(`{"received": true}`))
		}
	}))
	t.Cleanup(c.srv.Close)
	return c
}

// URL is where the endpoint the test adds points.
func (c *portalConsumer) URL() string { return c.srv.URL + "/hooks" }

// set makes the consumer verify with secret and answer status.
func (c *portalConsumer) set(secret string, status int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.secret, c.status = secret, status
}

// answered reports whether the consumer verified a request of the delivery and answered it
// status.
func (c *portalConsumer) answered(deliveryID string, status int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, h := range c.got {
		if h.DeliveryID == deliveryID && h.Verified == nil && h.Status == status {
			return true
		}
	}
	return false
}

// browser is one headless Chromium tab and what the test saw in it.
type browser struct {
	t   *testing.T
	ctx context.Context
	// docs is FLUXHOOK_PORTAL_SCREENSHOTS: a directory that also receives the screenshots,
	// compressed for docs/portal/.
	docs string

	mu      sync.Mutex
	console []string // exceptions and policy violations the page reported
}

const (
	// desktopWidth is the width of the desktop screenshots (docs/portal/*.png).
	desktopWidth = 1000
	// phoneWidth is the narrowest screen the portal is made for.
	phoneWidth = 360
	// stepTimeout bounds each wait of the test on the page.
	stepTimeout = 30 * time.Second
)

// newBrowser starts headless Chromium (exec) with one tab at desktop width, stopped at
// cleanup, and collects what the page reports to its console.
func newBrowser(t *testing.T, exec string) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exec),
		chromedp.NoSandbox,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.WindowSize(desktopWidth, 800),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	b := &browser{t: t, ctx: ctx, docs: os.Getenv("FLUXHOOK_PORTAL_SCREENSHOTS")}
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(desktopWidth, 800)); err != nil { // starts the browser, with no timeout
		t.Fatalf("starting %s: %v", exec, err)
	}
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.IsException() || strings.Contains(m.Text, "Content Security Policy") {
				b.mu.Lock()
				b.console = append(b.console, fmt.Sprintf("%s (%s:%d)", m.Text, m.URL, m.Line+1))
				b.mu.Unlock()
			}
		}
	}()
	return b
}

// do runs actions on the page, failing the test with what the page shows if they fail.
func (b *browser) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("%s: %v\nthe page shows:\n%s", what, err, b.pageText())
	}
}

// eval returns the value of a JavaScript expression on the page (evaluated through the
// DevTools protocol, which the page's CSP does not govern).
func eval[T any](b *browser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// pageText is what the page shows, for failure messages.
func (b *browser) pageText() string {
	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Second)
	defer cancel()
	text, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
	if err != nil {
		return fmt.Sprintf("(unreadable: %v)", err)
	}
	return text
}

// waitFor polls a JavaScript condition on the page until it holds, failing the test after
// stepTimeout. (chromedp.Poll would build its predicate with new Function, which the
// portal's CSP forbids, as it should.)
func (b *browser) waitFor(what, expr string) {
	b.t.Helper()
	deadline := time.Now().Add(stepTimeout)
	for {
		ctx, cancel := context.WithTimeout(b.ctx, 2*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("Boolean("+expr+")"))
		cancel()
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("timed out after %s waiting for %s (last error: %v)\nthe page shows:\n%s", stepTimeout, what, err, b.pageText())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitText waits until the page's main area shows text.
func (b *browser) waitText(text string) {
	b.t.Helper()
	b.waitFor(fmt.Sprintf("the page to show %q", text), `document.querySelector("main") && document.querySelector("main").innerText.includes(`+jsString(text)+`)`)
}

// jsString is s as a JavaScript string literal.
func jsString(s string) string {
	j, _ := json.Marshal(s)
	return string(j)
}

// click clicks the element an XPath or CSS selector finds, once it is visible.
func (b *browser) click(sel string) {
	b.t.Helper()
	b.do("clicking "+sel, chromedp.Click(sel, chromedp.NodeVisible))
}

// choose picks the option of value in the select whose id is id, once the option is there,
// as a person picking it does (the select's change event fires).
func (b *browser) choose(id, value string) {
	b.t.Helper()
	sel := `document.getElementById(` + jsString(id) + `)`
	b.waitFor(fmt.Sprintf("the option %q of #%s", value, id), sel+` && [...`+sel+`.options].some(o => o.value === `+jsString(value)+`)`)
	_ = eval[bool](b, `(() => { const s = `+sel+`; s.value = `+jsString(value)+`; s.dispatchEvent(new Event("change", {bubbles: true})); return true })()`)
}

// shot saves a PNG of the page as a person at width sees it, the whole page's height (up to
// 1,800 px), in the test's artifact directory (go test -artifacts keeps it) and, compressed,
// in FLUXHOOK_PORTAL_SCREENSHOTS when set.
func (b *browser) shot(name string, width int64) {
	b.t.Helper()
	b.waitFor("the page to finish loading", `!document.querySelector("main .loading")`)
	b.do("sizing the viewport", chromedp.EmulateViewport(width, 800))
	height := eval[int64](b, `Math.max(document.documentElement.scrollHeight, document.body.scrollHeight)`)
	height = min(max(height, 600), 1800)
	b.do("sizing the viewport", chromedp.EmulateViewport(width, height))
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	// Two animation frames: the layout at the new size is painted.
	_, _ = chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](`new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))`, chromedp.EvalAwaitPromise))
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	b.do("sizing the viewport", chromedp.EmulateViewport(desktopWidth, 800))
	write := func(dir string, png []byte) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
			b.t.Fatal(err)
		}
	}
	write(b.t.ArtifactDir(), png)
	if b.docs != "" {
		small, err := smallPNG(png)
		if err != nil {
			b.t.Fatalf("screenshot %s: %v", name, err)
		}
		write(b.docs, small)
	}
}

// fitsWidth checks that nothing makes the page scroll sideways: at 360 px every table
// becomes cards and long values wrap.
func (b *browser) fitsWidth(page string, width int64) {
	b.t.Helper()
	b.do("sizing the viewport", chromedp.EmulateViewport(width, 800))
	if w := eval[int64](b, `document.documentElement.scrollWidth`); w > width {
		b.t.Errorf("the %s page is %d px wide in a %d px window: it scrolls sideways", page, w, width)
	}
	b.do("sizing the viewport", chromedp.EmulateViewport(desktopWidth, 800))
}

// portalLink asks the API for a portal link with key at path.
func portalLink(t *testing.T, addr, key, path string) string {
	t.Helper()
	code, s := apiCall(t, addr, key, "POST", path, "")
	if code != http.StatusCreated {
		t.Fatalf("POST %s: %d %v", path, code, s)
	}
	return s["url"].(string)
}

// TestPortalInABrowser: a tenant's portal link, opened in headless Chromium, adds an endpoint
// pointing at a loopback consumer and shows its secret once; the consumer verifies signatures
// with the secret read from the page. A test event is seen delivered with the consumer's
// status; a failing consumer's attempts and dead letter are seen, and a replay is seen
// delivered. Another tenant's link shows none of it, an operator's link has the tenant selector
// and the status overview, and an expired link is refused. Each page is saved as a screenshot,
// at desktop width and at 360 px; no page may raise an exception or break its CSP.
func TestPortalInABrowser(t *testing.T) {
	t.Parallel()
	exec := chromiumPath(t)
	db := sqltest.NewMigrated(t)
	_, admin := addKey(t, db, "--admin")
	consumer := newPortalConsumer(t)
	env := serveEnv(db.URL, "")
	delete(env, "WEBHOOK_URL")
	delete(env, "WEBHOOK_SECRET")
	env["API_ADDR"] = "127.0.0.1:0"
	serve := startServe(t, "serve", env)
	addr := serve.logField(15*time.Second, "serving the management API", "addr")
	acmeLink := portalLink(t, addr, admin, "/v1/tenants/acme/portal-sessions")
	b := newBrowser(t, exec)

	// The link opens acme's portal, and its token leaves the address bar.
	b.do("opening acme's link", chromedp.Navigate(acmeLink))
	b.waitText("No endpoints yet: add one to start receiving webhooks.")
	if href := eval[string](b, `location.href`); strings.Contains(href, "fhp_") || !strings.HasSuffix(href, "#/endpoints") {
		t.Errorf("after opening the link the address is %s; want the token gone and #/endpoints", href)
	}

	// Add an endpoint; its secret is shown once, and copied.
	b.click(`//a[normalize-space()="Add endpoint"]`)
	b.do("filling the form", chromedp.WaitVisible(chromedp.ID("ep-url")),
		chromedp.SendKeys(chromedp.ID("ep-url"), consumer.URL()),
		chromedp.SendKeys(chromedp.ID("ep-description"), "Billing"),
		chromedp.SendKeys(chromedp.ID("ep-types"), "order.*, invoice.paid"))
	b.shot("endpoint-add", desktopWidth)
	b.click(`//form//button[normalize-space()="Add endpoint"]`)
	b.do("waiting for the secret", chromedp.WaitVisible(chromedp.ID("secret-value")))
	secret := strings.TrimSpace(b.text(chromedp.ID("secret-value")))
	if secret == "" {
		t.Fatal("the portal showed an empty secret")
	}
	consumer.set(secret, http.StatusOK)
	endpointID := strings.TrimPrefix(eval[string](b, `location.hash`), "#/endpoints/")
	// Clicked once the page has loaded: the endpoint's URL, filled in above the secret when it
	// arrives, moves the button, and a click aimed before that lands beside it (a loaded
	// machine showed it).
	b.waitFor("the endpoint page to finish loading", `!document.querySelector("main .loading")`)
	b.click(`#copy-secret`)
	b.waitFor("the copy to be confirmed", `/Copied to the clipboard|is selected/.test(document.querySelector(".secret-panel").innerText)`)
	b.shot("endpoint-secret", desktopWidth)

	// A test event, followed until the consumer's answer shows.
	b.click(`//button[normalize-space()="Send test event"]`)
	b.waitText("Test event delivered: the endpoint answered 200")
	testID := eval[string](b, `decodeURIComponent(document.querySelector("a[href^='#/deliveries/']").getAttribute("href").split("/").pop())`)
	if !consumer.answered(testID, http.StatusOK) {
		t.Fatalf("the consumer did not verify test delivery %s with the secret shown: %+v", testID, consumer.got)
	}

	// Rotate the secret, the old one stopping at once: the next test event verifies with the
	// new secret the page shows.
	b.click(`//button[normalize-space()="Rotate secret"]`)
	b.choose("rotate-grace", "0")
	b.click(`//button[normalize-space()="Rotate now"]`)
	b.waitFor("a new secret", `document.getElementById("secret-value") && document.getElementById("secret-value").innerText.trim() !== `+jsString(secret))
	secret = strings.TrimSpace(b.text(chromedp.ID("secret-value")))
	consumer.set(secret, http.StatusOK)
	b.click(`//button[normalize-space()="Send test event"]`)
	b.waitFor("the second test event delivered", `(() => { const a = document.querySelector(".result.ok a[href^='#/deliveries/']");
		return a && !a.getAttribute("href").endsWith(`+jsString(testID)+`) && /answered 200/.test(a.parentNode.innerText) })()`)
	testID = eval[string](b, `decodeURIComponent(document.querySelector(".result.ok a").getAttribute("href").split("/").pop())`)
	if !consumer.answered(testID, http.StatusOK) {
		t.Fatalf("the consumer did not verify test delivery %s with the rotated secret: %+v", testID, consumer.got)
	}

	// Edit the description; disable the endpoint (a test event is then refused with the API's
	// message) and enable it again.
	b.click(`//a[normalize-space()="Edit"]`)
	b.do("editing the description", chromedp.WaitVisible(chromedp.ID("ep-description")),
		// Select what the field holds and type over it, as a person does.
		chromedp.Evaluate[chromedp.Void](`document.getElementById("ep-description").select()`),
		chromedp.KeyEvent("Billing service"))
	b.click(`//button[normalize-space()="Save changes"]`)
	b.waitFor("the new description", `document.querySelector("main h1").innerText === "Billing service"`)
	b.click(`//button[normalize-space()="Disable"]`)
	b.do("giving a reason", chromedp.WaitVisible(chromedp.ID("disable-reason")), chromedp.SendKeys(chromedp.ID("disable-reason"), "maintenance"))
	b.click(`//button[normalize-space()="Disable endpoint"]`)
	b.waitText("The endpoint is disabled.")
	b.waitText("maintenance")
	b.click(`//button[normalize-space()="Send test event"]`)
	b.waitFor("the API's refusal", `document.querySelector("main .error") && /is disabled; enable it/.test(document.querySelector("main .error").innerText)`)
	b.click(`//button[normalize-space()="Enable"]`)
	b.waitText("The endpoint is enabled")

	// The consumer fails: two events are retried twice each, then dead-lettered.
	consumer.set(secret, http.StatusInternalServerError)
	ev, err := outbox.Enqueue(context.Background(), db.Pool, outbox.Event{EventType: "order.paid", Tenant: "acme",
		StreamID: "order-1042", Payload: map[string]any{"order": 1042, "amount": "59.00", "currency": "EUR"}})
	if err != nil {
		t.Fatal(err)
	}
	ev2, err := outbox.Enqueue(context.Background(), db.Pool, outbox.Event{EventType: "invoice.paid", Tenant: "acme",
		StreamID: "invoice-77", Payload: map[string]any{"invoice": 77}})
	if err != nil {
		t.Fatal(err)
	}
	b.click(`//nav//a[normalize-space()="Deliveries"]`)
	b.waitText("invoice.paid")
	b.choose("f-endpoint", endpointID)
	b.click(`//button[normalize-space()="Apply"]`)
	b.waitFor("both dead letters in the endpoint's deliveries",
		`document.querySelector("main tbody") && (document.querySelector("main tbody").innerText.match(/Dead-lettered/g) || []).length === 2`)
	b.shot("deliveries", desktopWidth)
	b.fitsWidth("deliveries", phoneWidth)
	b.click(`//a[@title="` + ev.DeliveryID + `"]`)
	b.waitFor("the dead letter on the delivery's page",
		`document.querySelector(".destination") && /Dead-lettered/.test(document.querySelector(".destination p").innerText) && document.querySelectorAll(".destination tbody tr").length === 3`)
	if got := eval[string](b, `[...document.querySelectorAll(".destination tbody tr td:nth-child(4)")].map(td => td.innerText).join(",")`); got != "500,500,500" {
		t.Errorf("the attempts' statuses read %q; want 500,500,500", got)
	}
	b.waitText(`"order": 1042`) // the payload
	b.shot("delivery-dead-lettered", desktopWidth)

	// The dead letters page lists both; the consumer is fixed, one is replayed, and the other
	// recovered with the endpoint.
	b.click(`//nav//a[normalize-space()="Dead letters"]`)
	b.waitFor("the dead letters listed", `document.querySelectorAll("main tbody tr").length === 2`)
	b.shot("dead-letters", desktopWidth)
	b.fitsWidth("dead letters", phoneWidth)
	consumer.set(secret, http.StatusOK)
	b.click(`//button[starts-with(@aria-label, "Replay order.paid")]`)
	b.waitText("Replayed order.paid")
	b.click(`//a[normalize-space()="Follow the delivery"]`)
	b.waitFor("the replay delivered", `document.querySelector(".destination") && /Delivered/.test(document.querySelector(".destination p").innerText)`)
	if !consumer.answered(ev.DeliveryID, http.StatusOK) {
		t.Errorf("the consumer did not receive the replay of %s", ev.DeliveryID)
	}
	b.shot("delivery", desktopWidth)
	b.shot("delivery-360", phoneWidth)
	b.fitsWidth("delivery", phoneWidth)
	b.click(`//nav//a[normalize-space()="Dead letters"]`)
	b.choose("rec-endpoint", endpointID)
	b.click(`//button[normalize-space()="Recover"]`)
	b.waitText("Recovery finished")
	pollUntil(t, stepTimeout, "the recovered delivery to arrive", func() bool { return consumer.answered(ev2.DeliveryID, http.StatusOK) })

	// The endpoint's page: its health and the chart of the last day.
	b.click(`//nav//a[normalize-space()="Endpoints"]`)
	b.waitFor("the endpoint listed", `document.querySelector("main tbody") && document.querySelector("main tbody").innerText.includes("Billing service")`)
	b.shot("endpoints", desktopWidth)
	b.shot("endpoints-360", phoneWidth)
	b.fitsWidth("endpoints", phoneWidth)
	b.click(`//main//a[normalize-space()="` + consumer.URL() + `"]`)
	b.waitFor("the chart", `document.querySelector(".chart svg[role=img] title") && document.querySelector(".chart svg rect.bar-fail")`)
	b.waitText("Recent deliveries")
	b.shot("endpoint", desktopWidth)
	b.shot("endpoint-360", phoneWidth)
	b.fitsWidth("endpoint", phoneWidth)

	// Another tenant's link shows none of it, not even by the delivery's id.
	b.do("opening globex's link", chromedp.Navigate(portalLink(t, addr, admin, "/v1/tenants/globex/portal-sessions")))
	b.waitText("No endpoints yet: add one to start receiving webhooks.")
	b.click(`//nav//a[normalize-space()="Deliveries"]`)
	b.waitText("No events in this time range.")
	b.click(`//nav//a[normalize-space()="Dead letters"]`)
	b.waitText("No dead letters: every delivery arrived or is still being retried.")
	b.do("opening acme's delivery", chromedp.Navigate(acmeLink[:strings.Index(acmeLink, "#")]+"#/deliveries/"+ev.DeliveryID))
	b.waitFor("the delivery not found", `document.querySelector("main .error") && /not found/i.test(document.querySelector("main .error").innerText)`)
	if text := b.pageText(); strings.Contains(text, "1042") || strings.Contains(text, "Billing service") {
		t.Errorf("globex's portal shows acme's data:\n%s", text)
	}

	// An operator's link: the tenant selector, and the status overview.
	b.do("opening an operator's link", chromedp.Navigate(portalLink(t, addr, admin, "/v1/portal-sessions")))
	b.choose("tenant-select", "acme")
	b.waitFor("acme's endpoint for the operator", `document.querySelector("main tbody") && document.querySelector("main tbody").innerText.includes("Billing service")`)
	b.click(`//nav//a[normalize-space()="Status"]`)
	b.waitText("Dispatchers")
	b.waitFor("the dispatcher listed", `document.querySelectorAll("main tbody tr").length >= 1`)
	b.shot("status", desktopWidth)

	// acme's link, expired, is refused with one sentence and nothing else.
	mustExec(t, db, `UPDATE webhook_api_keys SET expires_at = now() WHERE kind = 'portal' AND tenant = 'acme'`)
	b.do("opening acme's expired link", chromedp.Navigate(acmeLink))
	b.waitFor("the refusal", `document.querySelector("main").innerText.trim() === "This link has expired or is not valid: ask for a new one." && document.getElementById("top").hidden`)
	b.shot("expired", desktopWidth)

	// The CSP held: nothing was refused, and no script failed.
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range b.console {
		t.Errorf("the page reported: %s", m)
	}
}

// text returns the text of the element sel finds, as the page shows it.
func (b *browser) text(sel chromedp.ID) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Text(sel))
	if err != nil {
		b.t.Fatalf("reading %s: %v", sel, err)
	}
	return s
}

// smallPNG re-encodes a screenshot with a palette of its 256 most frequent colours (each
// other colour drawn as the nearest of them) at the best compression: a page of flat colours
// and anti-aliased text loses nothing a reader sees, and the file is a third of the size,
// which is what docs/portal/*.png needs.
func smallPNG(raw []byte) ([]byte, error) {
	img, err := png.Decode(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	r := img.Bounds()
	rgba := image.NewRGBA(r)
	draw.Draw(rgba, r, img, r.Min, draw.Src)
	pix := func(i int) color.RGBA {
		return color.RGBA{rgba.Pix[i], rgba.Pix[i+1], rgba.Pix[i+2], rgba.Pix[i+3]}
	}
	counts := map[color.RGBA]int{}
	for i := 0; i < len(rgba.Pix); i += 4 {
		counts[pix(i)]++
	}
	colors := make([]color.RGBA, 0, len(counts))
	for c := range counts {
		colors = append(colors, c)
	}
	key := func(c color.RGBA) int { return int(c.R)<<24 | int(c.G)<<16 | int(c.B)<<8 | int(c.A) }
	slices.SortFunc(colors, func(a, b color.RGBA) int {
		if n := counts[b] - counts[a]; n != 0 {
			return n
		}
		return key(a) - key(b)
	})
	palette := make(color.Palette, 0, 256)
	for _, c := range colors[:min(len(colors), 256)] {
		palette = append(palette, c)
	}
	index := make(map[color.RGBA]uint8, len(colors))
	for _, c := range colors {
		index[c] = uint8(palette.Index(c))
	}
	out := image.NewPaletted(r, palette)
	for i := 0; i < len(rgba.Pix); i += 4 {
		out.Pix[i/4] = index[pix(i)]
	}
	var buf bytes.Buffer
	enc := png.Encoder{CompressionLevel: png.BestCompression}
	if err := enc.Encode(&buf, out); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
