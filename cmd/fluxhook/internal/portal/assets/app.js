"use strict";
// The portal: see package portal's doc comment for how the session token is kept.
