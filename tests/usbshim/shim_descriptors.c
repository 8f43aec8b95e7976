/* Descriptors: the device descriptor, and the configuration descriptors parsed
 * from the raw bytes the server sends with the device list.  Part of the
 * libusb shim (shim_internal.h).
 */
#include "shim_internal.h"

EXPORT int libusb_get_device_descriptor(libusb_device *d, struct libusb_device_descriptor *desc)
{
    const unsigned char *b = d->descriptor;
    desc->bLength = b[0];
    desc->bDescriptorType = b[1];
    desc->bcdUSB = get_u16(b + 2);
    desc->bDeviceClass = b[4];
    desc->bDeviceSubClass = b[5];
    desc->bDeviceProtocol = b[6];
    desc->bMaxPacketSize0 = b[7];
    desc->idVendor = get_u16(b + 8);
    desc->idProduct = get_u16(b + 10);
    desc->bcdDevice = get_u16(b + 12);
    desc->iManufacturer = b[14];
    desc->iProduct = b[15];
    desc->iSerialNumber = b[16];
    desc->bNumConfigurations = b[17];
    return 0;
}

/* ---- configuration descriptors, parsed from the raw bytes ----------------------- */

struct owned_config {            /* what libusb_get_config_descriptor hands out */
    struct libusb_config_descriptor pub;   /* first: same address */
    unsigned char *raw;
};

static void free_config(struct libusb_config_descriptor *cfg)
{
    if (!cfg)
        return;
    for (int i = 0; i < cfg->bNumInterfaces && cfg->interface; i++) {
        const struct libusb_interface *in = &cfg->interface[i];
        for (int a = 0; a < in->num_altsetting; a++)
            free((void *)in->altsetting[a].endpoint);
        free((void *)in->altsetting);
    }
    free((void *)cfg->interface);
    free(((struct owned_config *)cfg)->raw);
    free(cfg);
}

/* Step past the descriptor at p and the descriptors after it that are not of
 * the types that end its run (interface, and endpoint when stop_at_endpoint):
 * that run, up to end, becomes its extra (NULL and 0 when empty).  Returns
 * where the next descriptor starts. */
static const unsigned char *past(const unsigned char *p, const unsigned char *end,
                                 int stop_at_endpoint, const unsigned char **extra,
                                 int *extra_length)
{
    p += p[0];
    const unsigned char *q = p;
    while (q + 2 <= end && q[0] >= 2 && q + q[0] <= end) {
        if (q[1] == LIBUSB_DT_INTERFACE || (stop_at_endpoint && q[1] == LIBUSB_DT_ENDPOINT))
            break;
        q += q[0];
    }
    *extra = q > p ? p : NULL;
    *extra_length = (int)(q - p);
    return q;
}

static int parse_config(const unsigned char *src, int len, struct libusb_config_descriptor **out)
{
    if (len < 9 || src[1] != LIBUSB_DT_CONFIG)
        return LIBUSB_ERROR_IO;
    struct owned_config *oc = calloc(1, sizeof *oc);
    if (!oc)
        return LIBUSB_ERROR_NO_MEM;
    oc->raw = malloc((size_t)len);
    if (!oc->raw) {
        free(oc);
        return LIBUSB_ERROR_NO_MEM;
    }
    memcpy(oc->raw, src, (size_t)len);
    const unsigned char *raw = oc->raw, *end = raw + len;
    struct libusb_config_descriptor *cfg = &oc->pub;
    cfg->bLength = raw[0];
    cfg->bDescriptorType = raw[1];
    cfg->wTotalLength = get_u16(raw + 2);
    cfg->bNumInterfaces = raw[4];
    cfg->bConfigurationValue = raw[5];
    cfg->iConfiguration = raw[6];
    cfg->bmAttributes = raw[7];
    cfg->MaxPower = raw[8];
    const unsigned char *p = past(raw, end, 0, &cfg->extra, &cfg->extra_length);

    struct libusb_interface *ifs =
        calloc(cfg->bNumInterfaces ? cfg->bNumInterfaces : 1, sizeof *ifs);
    cfg->interface = ifs;
    if (!ifs)
        goto no_mem;
    /* Interface descriptors in order; alternate settings of one interface follow
     * each other.  Interface numbers are taken as 0 .. bNumInterfaces-1. */
    while (p + 9 <= end && p[0] >= 9 && p[1] == LIBUSB_DT_INTERFACE) {
        int number = p[2];
        if (number >= cfg->bNumInterfaces)
            break;
        struct libusb_interface *in = &ifs[number];
        struct libusb_interface_descriptor *alts =
            realloc((void *)in->altsetting, (size_t)(in->num_altsetting + 1) * sizeof *alts);
        if (!alts)
            goto no_mem;
        in->altsetting = alts;
        struct libusb_interface_descriptor *d = &alts[in->num_altsetting++];
        memset(d, 0, sizeof *d);
        d->bLength = p[0];
        d->bDescriptorType = p[1];
        d->bInterfaceNumber = p[2];
        d->bAlternateSetting = p[3];
        d->bNumEndpoints = p[4];
        d->bInterfaceClass = p[5];
        d->bInterfaceSubClass = p[6];
        d->bInterfaceProtocol = p[7];
        d->iInterface = p[8];
        p = past(p, end, 1, &d->extra, &d->extra_length);
        struct libusb_endpoint_descriptor *eps =
            calloc(d->bNumEndpoints ? d->bNumEndpoints : 1, sizeof *eps);
        d->endpoint = eps;
        if (!eps)
            goto no_mem;
        int k = 0;
        while (k < d->bNumEndpoints && p + 7 <= end && p[0] >= 7 && p[1] == LIBUSB_DT_ENDPOINT) {
            struct libusb_endpoint_descriptor *e = &eps[k++];
            e->bLength = p[0];
            e->bDescriptorType = p[1];
            e->bEndpointAddress = p[2];
            e->bmAttributes = p[3];
            e->wMaxPacketSize = get_u16(p + 4);
            e->bInterval = p[6];
            if (p[0] >= 9) {
                e->bRefresh = p[7];
                e->bSynchAddress = p[8];
            }
            p = past(p, end, 1, &e->extra, &e->extra_length);
        }
        d->bNumEndpoints = (uint8_t)k;
    }
    *out = cfg;
    return 0;

no_mem:
    free_config(cfg);
    return LIBUSB_ERROR_NO_MEM;
}

EXPORT int libusb_get_config_descriptor(libusb_device *d, uint8_t index,
                                        struct libusb_config_descriptor **config)
{
    if (index >= d->nconfigs)
        return LIBUSB_ERROR_NOT_FOUND;
    return parse_config(d->configs[index], d->config_len[index], config);
}

EXPORT int libusb_get_active_config_descriptor(libusb_device *d,
                                               struct libusb_config_descriptor **config)
{
    return libusb_get_config_descriptor(d, 0, config);
}

EXPORT int libusb_get_config_descriptor_by_value(libusb_device *d, uint8_t value,
                                                 struct libusb_config_descriptor **config)
{
    for (int i = 0; i < d->nconfigs; i++)
        if (d->config_len[i] >= 9 && d->configs[i][5] == value)
            return parse_config(d->configs[i], d->config_len[i], config);
    return LIBUSB_ERROR_NOT_FOUND;
}

EXPORT void libusb_free_config_descriptor(struct libusb_config_descriptor *config)
{
    free_config(config);
}

static int endpoint_size(libusb_device *d, unsigned char endpoint)
{
    struct libusb_config_descriptor *cfg;
    if (libusb_get_config_descriptor(d, 0, &cfg) != 0)
        return LIBUSB_ERROR_NOT_FOUND;
    int size = LIBUSB_ERROR_NOT_FOUND;
    for (int i = 0; i < cfg->bNumInterfaces; i++)
        for (int a = 0; a < cfg->interface[i].num_altsetting; a++) {
            const struct libusb_interface_descriptor *in = &cfg->interface[i].altsetting[a];
            for (int e = 0; e < in->bNumEndpoints; e++)
                if (in->endpoint[e].bEndpointAddress == endpoint && size < 0)
                    size = in->endpoint[e].wMaxPacketSize & 0x7ff;
        }
    free_config(cfg);
    return size;
}

EXPORT int libusb_get_max_packet_size(libusb_device *d, unsigned char endpoint)
{
    return endpoint_size(d, endpoint);
}

EXPORT int libusb_get_max_iso_packet_size(libusb_device *d, unsigned char endpoint)
{
    return endpoint_size(d, endpoint);
}
