-- pyscheduler: the one egress policy for network destinations a client names (HTTP
-- targets of schedules). design.md: no loopback, link-local, private, unspecified or
-- otherwise non-public addresses and no credentials in URLs by default; an admin
-- allow-list (setting http_allow, set_http_allow) widens it. This file checks what a
-- URL says (create time: the literal host); pyscheduler/egress.py checks the address a
-- host name resolves to when it fires, with the same list (tests compare the two), and
-- connects to exactly that address. Loaded on every migrate (CREATE OR REPLACE).

-- _egress_blocked(): the networks refused unless allowed: everything that is not a
-- public unicast address. IPv6 forms that embed an IPv4 address (mapped, NAT64, 6to4,
-- Teredo) are refused whole: a public service has a plain address.
CREATE OR REPLACE FUNCTION pyscheduler._egress_blocked()
RETURNS cidr[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT ARRAY[
        '0.0.0.0/8', '10.0.0.0/8', '100.64.0.0/10', '127.0.0.0/8', '169.254.0.0/16', '172.16.0.0/12',
        '192.0.0.0/24', '192.0.2.0/24', '192.88.99.0/24', '192.168.0.0/16', '198.18.0.0/15',
        '198.51.100.0/24', '203.0.113.0/24', '224.0.0.0/4', '240.0.0.0/4',
        '::/127', '::ffff:0:0/96', '64:ff9b::/96', '64:ff9b:1::/48', '100::/64', '2001::/23', '2001:db8::/32',
        '2002::/16', '3fff::/20', '5f00::/16', 'fc00::/7', 'fe80::/10', 'fec0::/10', 'ff00::/8']::cidr[];
$$;

-- _egress_refusal(address): why this address may not be reached (NULL: it may).
CREATE OR REPLACE FUNCTION pyscheduler._egress_refusal(p_address inet)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(_setting('http_allow')::cidr[]) a WHERE p_address <<= a) THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(_egress_blocked()) b WHERE p_address <<= b) THEN
        RETURN format('%s is not a public address (loopback, private, link-local and the like are refused '
                      'unless an admin allows them with set_http_allow)', host(p_address));
    END IF;
    RETURN NULL;
END
$$;

-- _http_target_refusal(url): why a URL may not be an HTTP target (NULL: it may), from
-- what the URL itself says. Printable ASCII only (percent-encode a path, punycode a
-- host name), http or https, no user:password@, a host name or an IP address in its
-- canonical form (the resolver reads 127.1, 2130706433, 0x7f.1 and 0177.0.0.1 as
-- 127.0.0.1), no localhost, a port in 1..65535, at most 2048 bytes.
CREATE OR REPLACE FUNCTION pyscheduler._http_target_refusal(p_url text)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    m text[];
    v_host text;
    v_ip inet;
BEGIN
    IF p_url IS NULL OR octet_length(p_url) NOT BETWEEN 1 AND 2048 THEN
        RETURN 'the URL must be 1..2048 bytes';
    END IF;
    IF p_url !~ '^[!-~]+$' THEN
        RETURN 'the URL must be printable ASCII without spaces (percent-encode a path, punycode a host name)';
    END IF;
    m := regexp_match(p_url, '^https?://([^/?#]*)([/?#].*)?$', 'i');
    IF m IS NULL THEN
        RETURN 'the URL must start with http:// or https://';
    END IF;
    IF position('@' IN m[1]) > 0 THEN
        RETURN 'the URL must not carry credentials (user:password@): pass them another way';
    END IF;
    m := regexp_match(m[1], '^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:([0-9]{1,5}))?$');
    IF m IS NULL THEN
        RETURN 'the URL needs a host name or an IP address, and at most a port after it';
    END IF;
    IF m[3] IS NOT NULL AND m[3]::integer NOT BETWEEN 1 AND 65535 THEN
        RETURN format('port %s is not in 1..65535', m[3]);
    END IF;
    v_host := rtrim(lower(m[1]), '.');
    IF v_host LIKE '[%' THEN
        BEGIN
            v_ip := btrim(v_host, '[]')::inet;
        EXCEPTION WHEN invalid_text_representation THEN
            RETURN format('%s is not an IPv6 address', m[1]);
        END;
    ELSIF v_host ~ '^(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+))*$' THEN
        -- a number the resolver reads as an IPv4 address: only the canonical dotted quad
        IF v_host !~ '^(0|[1-9][0-9]{0,2})(\.(0|[1-9][0-9]{0,2})){3}$' THEN
            RETURN format('%s is not an IPv4 address in dotted-quad form', m[1]);
        END IF;
        BEGIN
            v_ip := v_host::inet;
        EXCEPTION WHEN invalid_text_representation THEN
            RETURN format('%s is not an IPv4 address', m[1]);
        END;
    ELSIF v_host = '' OR v_host = 'localhost' OR v_host LIKE '%.localhost' THEN
        RETURN format('host %s is this machine', coalesce(nullif(m[1], ''), '(empty)'));
    END IF;
    IF v_ip IS NOT NULL THEN
        RETURN _egress_refusal(v_ip);
    END IF;
    RETURN NULL;  -- a host name: its addresses are checked when it fires
END
$$;

CREATE OR REPLACE FUNCTION pyscheduler.set_http_allow(allow cidr[])
RETURNS cidr[]
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* set_http_allow(allow) -> cidr[]
   Replace the egress allow-list: networks that HTTP targets may reach although
   the egress policy refuses them by default (loopback, private, link-local,
   ...), e.g. ARRAY['10.20.0.0/16']::cidr[] for an internal service; '{}'
   allows none again. Applies to schedules created afterwards (create time
   checks a literal address) and to every firing (the resolved address).
   Returns the new list. Errors: PS001 a NULL element or list, more than
   1000 networks (every firing of an HTTP target reads the list). */
BEGIN
    IF allow IS NULL OR array_position(allow, NULL) IS NOT NULL OR cardinality(allow) > 1000 THEN
        RAISE EXCEPTION 'allow must be an array of at most 1000 networks without NULLs, got % networks',
                        cardinality(allow)
            USING ERRCODE = 'PS001', HINT = 'e.g. ARRAY[''10.20.0.0/16'']::cidr[], or ''{}'' for none.';
    END IF;
    UPDATE settings SET value = allow::text WHERE name = 'http_allow';
    RETURN allow;
END
$$;
COMMENT ON FUNCTION pyscheduler.set_http_allow(cidr[]) IS
    'Admin: networks HTTP targets may reach although the egress policy refuses them by default.';

CREATE OR REPLACE FUNCTION pyscheduler.http_allow()
RETURNS cidr[]
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
/* http_allow() -> cidr[]
   The egress allow-list (set_http_allow): the executors read it to check the
   address a target's host resolves to before every request. */
    SELECT pyscheduler._setting('http_allow')::cidr[];
$$;
COMMENT ON FUNCTION pyscheduler.http_allow() IS
    'The egress allow-list of HTTP targets (set_http_allow); read by the executors.';

SELECT pyscheduler._grant('scheduler', 'http_allow');
SELECT pyscheduler._grant('monitor', 'http_allow');
SELECT pyscheduler._grant('admin', 'set_http_allow');
